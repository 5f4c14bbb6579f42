package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/spec"
	"github.com/agentrun/agentrun/test/testenv"
)

// pooled is a runner with a pool for the python image, seeded with the
// shape of seedTask and filled.
type pooled struct {
	t    *testing.T
	cfg  *config.Config
	r    *runner.Runner
	pool *runner.Pool
}

func newPooled(t *testing.T, n int, seedTask string) *pooled {
	t.Helper()
	cfg := testConfig(t)
	cfg.Server.Pool = map[string]config.PoolEntry{pythonImage: {Count: n}}
	p := newPooledCfg(t, cfg, seedTask)
	p.waitReady(n)
	return p
}

// newPooledCfg is a runner with a pool as cfg's server.pool sizes it, its
// warm settings taken, seeded with the shape of seedTask.
func newPooledCfg(t *testing.T, cfg *config.Config, seedTask string) *pooled {
	t.Helper()
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &pooled{t: t, cfg: cfg, r: r, pool: r.NewPool(cfg.Server.PoolSizes())}
	r.UsePool(p.pool)
	p.pool.SetWarm(cfg)
	t.Cleanup(func() {
		if err := p.pool.Close(); err != nil {
			t.Errorf("closing pool: %v", err)
		}
		assertNoLeaks(t)
	})
	if err := p.pool.Seed(context.Background(), p.plan(seedTask)); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pooled) plan(taskJSON string) *task.Plan {
	p.t.Helper()
	plan, err := task.Load([]byte(taskJSON), p.cfg)
	if err != nil {
		p.t.Fatalf("task.Load: %v", err)
	}
	return plan
}

// waitReady waits until the pool holds n sandboxes of the python image.
func (p *pooled) waitReady(n int) {
	p.t.Helper()
	waitReady(p.t, p.pool, pythonImage, n)
}

// waitReady waits until pool holds n ready sandboxes of image ref, for at
// most 30 s.
func waitReady(t testing.TB, pool *runner.Pool, ref string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := pool.Stats()
		if st.Ready[ref] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never got %d ready sandboxes of %s: %+v", n, ref, st)
		}
		time.Sleep(time.Millisecond)
	}
}

// run runs the task and checks it was (or was not) served from the pool.
func (p *pooled) run(taskJSON string, wantHit bool) *result.Result {
	p.t.Helper()
	before := p.pool.Stats().Hits
	res := p.r.Run(context.Background(), p.plan(taskJSON), runapi.Hooks{})
	if res.Error != "" {
		p.t.Fatalf("run failed: %s", res.Error)
	}
	if hit := p.pool.Stats().Hits > before; hit != wantHit {
		p.t.Fatalf("served from the pool: %v, want %v", hit, wantHit)
	}
	return res
}

// poolRuntimes are the runtimes the pool tests run on, each with its task
// builder and a word the kernel release it shows names ("" for any).
var poolRuntimes = []struct {
	name    string
	task    func(code string, extra map[string]any) string
	release string
	parent  func() string // the cgroup the backend makes its runs' cgroups in
}{
	{"libcontainer", pyTask, "", lcParent},
	{"runsc", runscTask, "gvisor", runscParent},
}

// TestPoolRunsTaskInReadySandbox: a pooled run, on either runtime, gets
// its code, files and stdin, the task's timeout and output cap, and its
// collect; under runsc it is in gVisor.
func TestPoolRunsTaskInReadySandbox(t *testing.T) {
	for _, rt := range poolRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			p := newPooled(t, 2, rt.task("pass", nil))
			res := p.run(rt.task(`import sys, platform
data = open("/workspace/in.txt").read()
line = sys.stdin.readline()
open("/workspace/out.txt", "w").write(data.upper() + line)
print(platform.release())
print("x" * 5000)`, map[string]any{
				"files":   map[string]any{"in.txt": map[string]string{"content": "hello "}},
				"stdin":   "world\n",
				"collect": []string{"out.txt"},
				"limits":  map[string]any{"output_bytes": 100},
			}), true)
			if res.ExitCode != 0 || !res.StdoutTruncated || len(res.Stdout) != 100 || !strings.Contains(res.Stdout, rt.release) {
				t.Fatalf("exit %d, stdout %q (truncated %v); want 0, 100 bytes naming %q, truncated", res.ExitCode, res.Stdout, res.StdoutTruncated, rt.release)
			}
			if got, _ := base64.StdEncoding.DecodeString(res.Files["out.txt"].ContentBase64); string(got) != "HELLO world\n" {
				t.Fatalf("collected out.txt = %q (%+v)", got, res.Files["out.txt"])
			}

			res = p.run(rt.task("while True: pass", map[string]any{"limits": map[string]any{"timeout": "500ms"}}), true)
			if !res.TimedOut || res.ExitCode != result.ExitTimeout {
				t.Fatalf("timed_out %v exit %d; want true 124", res.TimedOut, res.ExitCode)
			}
			if res.DurationMS < 500 || res.DurationMS > 3000 {
				t.Fatalf("duration %d ms for a 500ms timeout", res.DurationMS)
			}
		})

	}
}

// TestPoolProgramStartsAhead: a libcontainer sandbox in the pool waits
// with its init (tini) and its program's start (agentrun-seccomp
// --handover) running, and nothing of the task: both as the sandbox's own
// uid and gid, with no_new_privs, no capability and the very filters of a
// cold run's program, read from the host. At the run the start executes
// the program in its place, under no filter more, with no descriptor but
// its stdio.
func TestPoolProgramStartsAhead(t *testing.T) {
	cold, _, _ := programFilters(t, testConfig(t))
	p := newPooled(t, 1, pyTask("pass", nil))
	start := 0
	for _, pid := range pooledInits(t) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		args := strings.Split(string(cmdline), "\x00")
		switch {
		case len(args) > 3 && args[0] == "/dev/agentrun-seccomp" && args[1] == "--handover" && args[3] == "python3":
			start = pid
		case args[0] == spec.InitPath:
		default:
			t.Fatalf("process %d of a pooled sandbox: %q", pid, args)
		}
		assertConfined(t, fmt.Sprintf("process %d (%s)", pid, args[0]), string(status))
	}
	if start == 0 {
		t.Fatal("no program's start waits in the pooled sandbox")
	}
	filters, err := seccompFilters(start)
	if err != nil {
		t.Fatalf("reading the start's filters: %v", err)
	}
	if len(filters) != len(cold) {
		t.Fatalf("the start has %d filters, a cold run's program %d", len(filters), len(cold))
	}
	for i := range cold {
		if !slices.Equal(filters[i].insns, cold[i].insns) || filters[i].flags != cold[i].flags {
			t.Errorf("filter %d: %d instructions, flags %#x in the start; %d, flags %#x in a cold run's program",
				i, len(filters[i].insns), filters[i].flags, len(cold[i].insns), cold[i].flags)
		}
	}

	// The run's program is the start's process, executed in place.
	done := make(chan *result.Result, 1)
	go func() {
		done <- p.r.Run(context.Background(), p.plan(pyTask(`import os, sys, time
open_fds = []
for fd in range(3, 1024):
    try:
        os.fstat(fd)
        open_fds.append(fd)
    except OSError:
        pass
print("open fds above 2:", open_fds)
print(open("/proc/self/status").read())
sys.stdout.flush()
time.sleep(2)`, map[string]any{"limits": map[string]any{"timeout": "30s"}})), runapi.Hooks{})
	}()
	became := ""
	for deadline := time.Now().Add(20 * time.Second); became != "python3" && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", start))
		became = strings.TrimSpace(string(comm))
	}
	res := <-done
	if res.Error != "" || res.ExitCode != 0 {
		t.Fatalf("the pooled run: exit %d, %s (stderr %q)", res.ExitCode, res.Error, res.Stderr)
	}
	if became != "python3" {
		t.Errorf("the start's process never became the program (last %q)", became)
	}
	assertConfined(t, "the program", res.Stdout)
	if !strings.Contains(res.Stdout, "open fds above 2: []\n") {
		t.Errorf("the program has descriptors open above 2 (the hand-over's?): %s", res.Stdout)
	}
	if want := fmt.Sprintf("Seccomp_filters:\t%d\n", len(cold)); !strings.Contains(res.Stdout, want) {
		t.Errorf("the program's status has no %q: %s", want, res.Stdout)
	}
}

// assertConfined checks a sandbox process's /proc status: a uid and gid
// not root's, no_new_privs, a seccomp filter, and no capability at all.
func assertConfined(t *testing.T, what, status string) {
	t.Helper()
	for _, want := range []string{"NoNewPrivs:\t1\n", "Seccomp:\t2\n", "CapInh:\t0000000000000000\n", "CapPrm:\t0000000000000000\n",
		"CapEff:\t0000000000000000\n", "CapBnd:\t0000000000000000\n", "CapAmb:\t0000000000000000\n"} {
		if !strings.Contains(status, want) {
			t.Errorf("%s: no %q in its status:\n%s", what, want, status)
		}
	}
	for _, l := range strings.Split(status, "\n") {
		if f := strings.Fields(l); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
			if f[1] == "0" || f[1] != f[2] || f[1] != f[3] || f[1] != f[4] {
				t.Errorf("%s: %s", what, l)
			}
		}
	}
}

// TestPoolSandboxesServeOneRunEach: what one pooled run, on either
// runtime, leaves in /tmp, /workspace or as a process is not there for the
// next, which runs as another uid.
func TestPoolSandboxesServeOneRunEach(t *testing.T) {
	for _, rt := range poolRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			p := newPooled(t, 2, rt.task("pass", nil))
			first := p.run(rt.task(`import os, subprocess
open("/tmp/mark", "w").write("1")
open("/workspace/mark", "w").write("1")
subprocess.Popen(["sleep", "60"], start_new_session=True)
print(os.getuid())`, nil), true)
			second := p.run(rt.task(`import os
print(os.path.exists("/tmp/mark"), os.path.exists("/workspace/mark"))
print(sorted(int(d) for d in os.listdir("/proc") if d.isdigit()) == [1, os.getpid()])
print(os.getuid())`, nil), true)
			if first.ID == second.ID {
				t.Fatalf("both runs had id %s", first.ID)
			}
			lines := strings.Split(strings.TrimSpace(second.Stdout), "\n")
			if len(lines) != 3 || lines[0] != "False False" || lines[1] != "True" {
				t.Fatalf("second run saw %q; want nothing of the first run and only the init and itself", second.Stdout)
			}
			if uid := strings.TrimSpace(first.Stdout); uid == lines[2] || !sandboxUID42(uid+" 42\n") {
				t.Fatalf("uids %q and %q; want two distinct sandbox uids", uid, lines[2])
			}
		})

	}
}

// TestPoolEnforcesLimits: the pooled sandbox is as locked down as a cold
// one: read-only root, memory cap with the OOM kill reported, pids cap,
// and the seccomp profile.
func TestPoolEnforcesLimits(t *testing.T) {
	limits := map[string]any{"limits": map[string]any{"memory": "64m", "pids": 16}}
	p := newPooled(t, 1, pyTask("pass", limits))

	res := p.run(pyTask(`import os
try:
    open("/hacked", "w")
except OSError as e:
    print("denied", e.errno)
status = open("/proc/self/status").read()
print([l for l in status.splitlines() if l.startswith(("CapEff", "NoNewPrivs", "Seccomp:", "Uid"))])`, limits), true)
	for _, want := range []string{"denied 30", "'CapEff:\\t0000000000000000'", "'NoNewPrivs:\\t1'", "'Seccomp:\\t2'"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("stdout %q lacks %q", res.Stdout, want)
		}
	}
	// An id of the suite's run_uids.
	var uid int64
	if _, after, ok := strings.Cut(res.Stdout, "'Uid:\\t"); !ok {
		t.Errorf("stdout %q lacks the uid", res.Stdout)
	} else if _, err := fmt.Sscan(after, &uid); err != nil || !scope.HasUID(uid) {
		t.Errorf("the program ran as uid %d (%v), not one of run_uids %d+%d", uid, err, scope.UIDFirst, scope.UIDCount)
	}

	assertPoolCaps(t, p, pyTask, limits)
}

// assertPoolCaps checks, in the next two sandboxes of p, that a fork bomb
// meets the pids cap (EAGAIN) and that a memory hog is OOM-killed and
// reported so: task builds each run's task with limits.
func assertPoolCaps(t *testing.T, p *pooled, task func(string, map[string]any) string, limits map[string]any) {
	t.Helper()
	p.waitReady(1)
	res := p.run(task(`import os
n = 0
try:
    while True:
        if os.fork() == 0:
            import time; time.sleep(30)
        n += 1
except OSError as e:
    print("fork failed after", n, e.errno)`, limits), true)
	if !strings.Contains(res.Stdout, "fork failed after") || !strings.Contains(res.Stdout, " 11") {
		t.Errorf("fork bomb: %q; want EAGAIN (11) below the pids cap", res.Stdout)
	}

	p.waitReady(1)
	res = p.run(task(`b = []
while True:
    b.append(bytearray(8 << 20))`, limits), true)
	if !res.OOMKilled || res.ExitCode != 137 {
		t.Fatalf("memory hog: oom_killed %v exit %d; want true 137", res.OOMKilled, res.ExitCode)
	}
}

// TestPoolFollowsTaskShape: a run of another shape runs cold, and the pool
// then keeps sandboxes of that shape; a shape with services, or for runsc,
// is never pooled.
func TestPoolFollowsTaskShape(t *testing.T) {
	p := newPooled(t, 1, pyTask("pass", nil))
	withEnv := pyTask(`import os; print(os.environ["COLOR"])`, map[string]any{"env": map[string]string{"COLOR": "blue"}})
	if res := p.run(withEnv, false); res.Stdout != "blue\n" {
		t.Fatalf("cold run printed %q", res.Stdout)
	}
	p.waitReady(1)
	if res := p.run(withEnv, true); res.Stdout != "blue\n" {
		t.Fatalf("pooled run printed %q", res.Stdout)
	}

	p.cfg.Network.Services = map[string]config.Service{"api": {URL: "https://api.example.com",
		Rules: []config.ServiceRule{{Methods: []string{"GET"}, Paths: []string{"/**"}}}}}
	for _, extra := range []map[string]any{{"network": map[string]any{"services": []string{"api"}}}} {
		err := p.pool.Seed(context.Background(), p.plan(pyTask("pass", extra)))
		if err == nil || !strings.Contains(err.Error(), "never runs from the pool") {
			t.Errorf("Seed(%v) = %v; want a refusal", extra, err)
		}
	}
	if err := p.pool.Seed(context.Background(), p.plan(pyTask("pass", map[string]any{"image": busyboxImage}))); err == nil {
		t.Error("Seed of an image the pool does not keep succeeded")
	}
}

// TestPoolSkipsSandboxesOfARemovedImage: sandboxes made on a rootfs that
// rmi removed are never used, even when the image is unpacked again at the
// same path; the run goes cold and the pool starts over.
func TestPoolSkipsSandboxesOfARemovedImage(t *testing.T) {
	ref := "oci:" + busyboxLayout() + ":latest"
	cfg := testConfig(t)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := r.NewPool(map[string]int{ref: 1})
	r.UsePool(pool)
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("closing pool: %v", err)
		}
		assertNoLeaks(t)
	})
	plan := func() *task.Plan {
		p, err := task.Load([]byte(`{"image": "`+ref+`", "command": ["cat", "/bin/busybox"]}`), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if err := pool.Seed(context.Background(), plan()); err != nil {
		t.Fatal(err)
	}
	waitPool := func() {
		t.Helper()
		waitReady(t, pool, ref, 1)
	}
	run := func(wantHit bool) {
		t.Helper()
		before := pool.Stats().Hits
		res := r.Run(context.Background(), plan(), runapi.Hooks{})
		if res.Error != "" || res.ExitCode != 0 || res.StdoutBytes < 1000 {
			t.Fatalf("run: exit %d, %d bytes of stdout, error %q, stderr %q", res.ExitCode, res.StdoutBytes, res.Error, res.Stderr)
		}
		if hit := pool.Stats().Hits > before; hit != wantHit {
			t.Fatalf("served from the pool: %v, want %v", hit, wantHit)
		}
	}
	waitPool()
	run(true)
	waitPool()

	st, err := image.Open(cfg.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Remove(ref); err != nil {
		t.Fatal(err)
	}
	run(false) // unpacked again; the ready sandbox's rootfs is gone
	waitPool()
	run(true)
}

// TestPoolDropsDeadSandboxes: a pooled sandbox whose processes were killed
// while it waited is dropped, and the run goes cold instead of failing.
func TestPoolDropsDeadSandboxes(t *testing.T) {
	p := newPooled(t, 1, pyTask("pass", nil))
	for _, pid := range pooledInits(t) {
		// The init's death ends the program's start with it.
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			t.Fatal(err)
		}
		waitDead(t, pid)
	}
	if res := p.run(pyTask("print(6 * 7)", nil), false); res.Stdout != "42\n" {
		t.Fatalf("run after the kill printed %q (stderr %q)", res.Stdout, res.Stderr)
	}
	p.waitReady(1)
	if res := p.run(pyTask("print(6 * 7)", nil), true); res.Stdout != "42\n" {
		t.Fatalf("pooled run printed %q", res.Stdout)
	}
}

// pooledInits are the processes in the cgroups of runs: with a pool full
// and no run going on, those of the ready sandboxes (libcontainer's: the
// init, and the program's start that waits for the run). There must be
// one.
func pooledInits(t *testing.T) []int { return runProcesses(t, lcParent()) }

// runProcesses are the processes in the cgroups of runs under the cgroup
// parent (a backend's), in any hierarchy. There must be one.
func runProcesses(t *testing.T, parent string) []int {
	t.Helper()
	pids := runPIDs(parent)
	if len(pids) == 0 {
		t.Fatalf("found no process in a run's cgroup under /%s", parent)
	}
	return pids
}

// runPIDs are the processes in the cgroups of runs under the cgroup
// parent, in any hierarchy.
func runPIDs(parent string) []int {
	var pids []int
	for _, root := range testenv.CgroupRoots() {
		runs, _ := filepath.Glob(filepath.Join(root, parent, "ar-*", "cgroup.procs"))
		for _, procs := range runs {
			b, _ := os.ReadFile(procs)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, pid) {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// waitDead waits until process pid has died (a zombie, or gone).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		// The state follows the command name in parentheses.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return
		}
	}
	t.Fatalf("process %d still alive 5s after SIGKILL", pid)
}

// TestPoolStoppedSandboxDoesNotHang: a pooled init that cannot take the
// exec signal (stopped) does not hold the run: it is killed and the run
// goes cold.
func TestPoolStoppedSandboxDoesNotHang(t *testing.T) {
	p := newPooled(t, 1, pyTask("pass", nil))
	for _, pid := range pooledInits(t) {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if res := p.run(pyTask("print(6 * 7)", nil), false); res.Stdout != "42\n" {
		t.Fatalf("run printed %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the run took %v", took)
	}
}

// sleepers starts n runs of busybox's sleep (an image the pool does not
// keep) for secs seconds each, and returns once the pool counts them all
// running; Wait on the group waits for them to end.
func (p *pooled) sleepers(n, secs int) *sync.WaitGroup {
	p.t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			res := p.r.Run(context.Background(), p.plan(fmt.Sprintf(`{"image":%q,"command":["sleep","%d"],"limits":{"timeout":"30s"}}`, busyboxImage, secs)), runapi.Hooks{})
			if res.Error != "" || res.ExitCode != 0 {
				p.t.Errorf("sleeper: exit %d, %s", res.ExitCode, res.Error)
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for p.pool.Stats().Running < n {
		if time.Now().After(deadline) {
			wg.Wait()
			p.t.Fatalf("the sleepers never ran: %+v", p.pool.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return &wg
}

// TestPoolFillsOneAtATimeUnderLoad: while runs take every CPU the pool
// makes one sandbox at a time, never more, and runs that find none set up
// their own at once.
func TestPoolFillsOneAtATimeUnderLoad(t *testing.T) {
	p := newPooled(t, 2, pyTask("pass", nil))
	// Runs of an image the pool does not keep, one per CPU.
	n := goruntime.NumCPU()
	wg := p.sleepers(n, 8)
	p.run(pyTask("print(1)", nil), true)
	p.run(pyTask("print(2)", nil), true)
	for p.pool.Stats().Ready[pythonImage] < 2 {
		st := p.pool.Stats()
		if st.Running < n {
			t.Fatalf("the sleepers ended before the pool refilled: %+v", st)
		}
		if st.Filling > 1 {
			t.Fatalf("the pool made %d sandboxes at once while runs took every CPU: %+v", st.Filling, st)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
}

// TestPoolWaitsWhileRunsOutnumberCPUs: while more runs go on than there
// are CPUs the pool makes no sandbox (a fill would only race them), and it
// refills as soon as they end.
func TestPoolWaitsWhileRunsOutnumberCPUs(t *testing.T) {
	p := newPooled(t, 2, pyTask("pass", nil))
	n := goruntime.NumCPU() + 1
	wg := p.sleepers(n, 4)
	p.run(pyTask("print(1)", nil), true)
	p.run(pyTask("print(2)", nil), true)
	var failed string // reported once the sleepers are done, so that they are not left behind
	for end := time.Now().Add(time.Second); time.Now().Before(end) && failed == ""; time.Sleep(time.Millisecond) {
		st := p.pool.Stats()
		if st.Running < n {
			failed = fmt.Sprintf("the sleepers ended too soon: %+v", st)
		} else if st.Filling > 0 || st.Ready[pythonImage] > 0 {
			failed = fmt.Sprintf("the pool filled while %d runs took %d CPUs: %+v", st.Running, n-1, st)
		}
	}
	wg.Wait()
	if failed != "" {
		t.Fatal(failed)
	}
	// It refills once they end.
	p.waitReady(2)
}

// TestPoolFillsInParallel: with no run going on, the pool makes as many
// sandboxes at once as there are CPUs (up to what it lacks), not one after
// the other.
func TestPoolFillsInParallel(t *testing.T) {
	cfg := testConfig(t)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool := r.NewPool(map[string]int{pythonImage: 2})
	r.UsePool(pool)
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("closing pool: %v", err)
		}
		assertNoLeaks(t)
	})
	plan, err := task.Load([]byte(pyTask("pass", nil)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Seed(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	want, most := min(2, goruntime.NumCPU()), 0
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := pool.Stats()
		most = max(most, st.Filling)
		if st.Ready[pythonImage] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never got 2 ready sandboxes: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	if most != want {
		t.Fatalf("at most %d sandboxes were made at once; want %d", most, want)
	}
}

// ownCPUPy burns about 100 ms of cpu, then prints how much cpu it has used
// itself (getrusage: user and system, in ms). The loop counts, making no
// system call: under runsc each one (a clock read, say) is work of the
// sandbox's kernel that the cgroup counts and the program's own count may
// not, and a loop that read the clock to end made that gap vary by 150 ms
// from run to run on a busy host.
const ownCPUPy = `
import resource
n = 0
for i in range(1000000):
    n += i
r = resource.getrusage(resource.RUSAGE_SELF)
print(int((r.ru_utime + r.ru_stime) * 1000))
`

// TestUsageIsTheProgramsOwn: a run's cpu_ms is the program's cpu time, on
// either runtime, cold or from the pool, never the container's set-up
// (the init's, the sandbox's boot: done before the program, for a pooled
// sandbox long before), which the cgroup counted too. Before the pooled
// run a process of the test's own burns CPU in the waiting sandbox's
// cgroup (at least 500 ms, measured): a run that counted what its cgroup
// did before the program is above the program's own count by at least
// that much, so the pooled run must stay below half of it. Each run's
// cpu_ms is also at least what the program counted itself (under runsc,
// whose kernel counts the program's time its own way, at least half of
// it), and not above twice it (three times under runsc): bounds that
// scale with the host's speed, as both counts do.
func TestUsageIsTheProgramsOwn(t *testing.T) {
	for _, rt := range poolRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			taskJSON := rt.task(ownCPUPy, nil)
			check := func(how string, res *result.Result, burned time.Duration) {
				t.Helper()
				own, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%s run: exit %d stdout %q stderr %q", how, res.ExitCode, res.Stdout, res.Stderr)
				}
				extra := res.CPUMS - own
				t.Logf("%s run: cpu_ms %d, the program's own %d ms", how, res.CPUMS, own)
				floor, ceiling := own-1, 2*own
				if rt.name == "runsc" {
					floor, ceiling = own/2, 3*own
				}
				if res.CPUMS < floor {
					t.Errorf("%s run: cpu_ms %d is below the program's own %d ms", how, res.CPUMS, own)
				}
				if res.CPUMS > ceiling {
					t.Errorf("%s run: cpu_ms %d is above %d, for the program's own %d ms: the set-up is counted", how, res.CPUMS, ceiling, own)
				}
				if burned > 0 && extra >= burned.Milliseconds()/2 {
					t.Errorf("%s run: cpu_ms %d is %d ms above the program's own %d, half or more of the %v burned in its cgroup before it: that is counted", how, res.CPUMS, extra, own, burned)
				}
			}
			check("cold", runIn(t, rt.name, taskJSON), 0)
			p := newPooled(t, 1, taskJSON)
			burned := burnInRunCgroup(t, rt.parent())
			t.Logf("burned %v of CPU in the pooled sandbox's cgroup before its run", burned)
			check("pooled", p.run(taskJSON, true), burned)
		})

	}
}

// burnInRunCgroup runs a process that burns CPU (dd copying 64 GiB of
// zeros: system time, about a second here) in the one run cgroup under
// parent, in every hierarchy, and returns the CPU time it used, at least
// 500 ms: time that cgroup counts before any program runs in it.
func burnInRunCgroup(t *testing.T, parent string) time.Duration {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read x; exec dd if=/dev/zero of=/dev/null bs=1M count=65536 2>/dev/null")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Ended (unjoined, at its read) on any failure below.
	failed := func(format string, args ...any) {
		t.Helper()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf(format, args...)
	}
	joined := 0
	for _, root := range testenv.CgroupRoots() {
		dirs, _ := filepath.Glob(filepath.Join(root, parent, "ar-*"))
		if len(dirs) > 1 {
			failed("more than one run cgroup under %s: %v", filepath.Join(root, parent), dirs)
		}
		for _, dir := range dirs {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
				failed("joining the burner to %s: %v", dir, err)
			}
			joined++
		}
	}
	if joined == 0 {
		failed("found no run cgroup under /%s", parent)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		failed("starting the burner: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the burner: %v", err)
	}
	used := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	if used < 500*time.Millisecond {
		t.Fatalf("the burner used only %v of CPU", used)
	}
	return used
}

// TestMountsHeldUntilTearDown: a libcontainer run's mount namespace,
// pooled or cold, outlives its program: agentrun holds it when the answer
// is given (so that its mounts' detach, and the RCU grace period it waits
// for, come after the answer, not in the exit that the answer waits for),
// and no longer once the run is torn down.
func TestMountsHeldUntilTearDown(t *testing.T) {
	p := newPooled(t, 1, pyTask("pass", nil))
	for _, pooled := range []bool{true, false} {
		if !pooled {
			// The pool gone, the run is cold.
			if err := p.pool.Close(); err != nil {
				t.Fatal(err)
			}
		}
		var atAnswer []string
		res := p.r.Run(context.Background(), p.plan(pyTask(`import os; print(os.readlink("/proc/self/ns/mnt"))`, nil)), runapi.Hooks{
			Result: func(*result.Result) { atAnswer = mountNamespacesHeld(t) },
		})
		own := strings.TrimSpace(res.Stdout)
		if res.Error != "" || !strings.HasPrefix(own, "mnt:[") {
			t.Fatalf("pooled %v: %q, %s", pooled, res.Stdout, res.Error)
		}
		if !slices.Contains(atAnswer, own) {
			t.Errorf("pooled %v: the run's mount namespace %s not held at the answer (held: %q)", pooled, own, atAnswer)
		}
		if held := mountNamespacesHeld(t); slices.Contains(held, own) {
			t.Errorf("pooled %v: the run's mount namespace %s still held after its tear-down", pooled, own)
		}
	}
	if held := mountNamespacesHeld(t); len(held) != 0 {
		t.Errorf("mount namespaces %q held once the runs and the pool are gone", held)
	}
}

// mountNamespacesHeld are the mount namespaces ("mnt:[INODE]") this
// process has descriptors of.
func mountNamespacesHeld(t *testing.T) []string { return namespacesHeld(t, "mnt") }

// namespacesHeld are the namespaces of kind ("mnt", "net": "KIND:[INODE]")
// this process has descriptors of, one entry a descriptor.
func namespacesHeld(t *testing.T, kind string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, kind+":[") {
			held = append(held, l)
		}
	}
	return held
}

// TestPoolExecFailsAsCold: a program the kernel will not execute fails in
// a pooled sandbox (where the program's start executes it) as in a cold
// one (where tini does): 127 for one not found, 126 for one not
// executable, with the program named on stderr.
func TestPoolExecFailsAsCold(t *testing.T) {
	for _, tc := range []struct {
		program string
		exit    int
	}{
		{"/tmp/none", 127},
		{"/etc/passwd", 126},
	} {
		t.Run(strings.TrimPrefix(tc.program, "/"), func(t *testing.T) {
			task := fmt.Sprintf(`{"image":%q,"command":[%q]}`, pythonImage, tc.program)
			cold := runTask(t, task)
			p := newPooled(t, 1, task)
			pooled := p.run(task, true)
			for _, res := range []*result.Result{cold, pooled} {
				if res.ExitCode != tc.exit || !strings.Contains(res.Stderr, tc.program) {
					t.Errorf("cold: exit %d, stderr %q; pooled: exit %d, stderr %q; want %d naming %s",
						cold.ExitCode, cold.Stderr, pooled.ExitCode, pooled.Stderr, tc.exit, tc.program)
					break
				}
			}
		})
	}
}
