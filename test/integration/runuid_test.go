package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/uidpool"
)

// heldRun is a run going on in the background, past a line it printed.
type heldRun struct {
	out    string // its stdout up to and including the marker line
	cancel context.CancelFunc
	done   chan *result.Result
	once   sync.Once
	res    *result.Result
}

// holdRun starts plan on r and returns once its stdout holds marker and
// the end of its line, with the output so far; stop it with end.
func holdRun(t *testing.T, r *runner.Runner, plan *task.Plan, marker string) *heldRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldRun{cancel: cancel, done: make(chan *result.Result, 1)}
	t.Cleanup(func() { h.end() }) // a test that fails on the way ends it too
	var mu sync.Mutex
	var out strings.Builder
	seen := make(chan struct{})
	var once sync.Once
	go func() {
		h.done <- r.Run(ctx, plan, runapi.Hooks{Output: func(stream string, data []byte) {
			if stream != "stdout" {
				return
			}
			mu.Lock()
			out.Write(data)
			if i := strings.Index(out.String(), marker); i >= 0 && strings.Contains(out.String()[i:], "\n") {
				once.Do(func() { close(seen) })
			}
			mu.Unlock()
		}})

	}()
	select {
	case <-seen:
	case res := <-h.done:
		h.done <- res
		t.Fatalf("held run ended before %q: exit %d, error %q, stdout %q, stderr %q", marker, res.ExitCode, res.Error, res.Stdout, res.Stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("held run never printed %q", marker)
	}
	mu.Lock()
	h.out = out.String()
	mu.Unlock()
	return h
}

// end cancels the held run and returns its result.
func (h *heldRun) end() *result.Result {
	h.once.Do(func() {
		h.cancel()
		h.res = <-h.done
	})
	return h.res
}

func loadPlan(t *testing.T, cfg *config.Config, code string, extra map[string]any) *task.Plan {
	t.Helper()
	plan, err := task.Load([]byte(pyTask(code, extra)), cfg)
	if err != nil {
		t.Fatalf("task.Load: %v", err)
	}
	return plan
}

// idsLine is the python that prints the program's ids, from
// /proc/self/status: "ids UID GID", the four uids and gids equal.
const idsLine = `
import os
st = {l.split(':')[0]: l.split()[1:] for l in open('/proc/self/status') if l.startswith(('Uid:', 'Gid:', 'Groups:'))}
assert len(set(st['Uid'])) == 1 and len(set(st['Gid'])) == 1 and st['Groups'] == [], st
print('ids', st['Uid'][0], st['Gid'][0], flush=True)
`

// parseIDs reads the "ids UID GID" line of out; uid and gid must be one id.
func parseIDs(t *testing.T, out string) uint32 {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "ids" {
			if f[1] != f[2] {
				t.Fatalf("uid %s and gid %s differ", f[1], f[2])
			}
			id, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(id)
		}
	}
	t.Fatalf("no ids line in %q", out)
	return 0
}

// reservations lists the uids reserved by runs of the suite's state dir,
// among the host's reservations (uidpool.DefaultDir).
func reservations(t *testing.T) []string {
	t.Helper()
	var names []string
	for uid := range reservedBy(t, stateDir) {
		names = append(names, uid)
	}
	return names
}

// reservedBy maps the uids reserved by runs of state dir sd, among the
// host's reservations, to their run ids.
func reservedBy(t *testing.T, sd string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(uidpool.DefaultDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	held := map[string]string{}
	for _, e := range ents {
		owner, err := os.Readlink(filepath.Join(uidpool.DefaultDir, e.Name()))
		if err == nil && filepath.Dir(owner) == filepath.Join(sd, "runs") {
			held[e.Name()] = filepath.Base(owner)
		}
	}
	return held
}

// TestRunUIDsDistinct: two runs at once run as two different uids (and
// gids) of the configured range, on both runtimes, and each uid is
// reserved while its run lives and free after.
func TestRunUIDsDistinct(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := cfgFor(t, rt)
		cfg.RunUIDs = config.RunUIDs{First: 3000000000, Count: 2}
		r, err := compose.Runner(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		code := idsLine + "print('up', flush=True)\nimport time\ntime.sleep(60)\n"
		a := holdRun(t, r, loadPlan(t, cfg, code, map[string]any{"limits": map[string]any{"timeout": "60s"}}), "up")
		b := holdRun(t, r, loadPlan(t, cfg, code, map[string]any{"limits": map[string]any{"timeout": "60s"}}), "up")
		ua, ub := parseIDs(t, a.out), parseIDs(t, b.out)
		held := reservations(t)
		a.end()
		b.end()
		if ua == ub {
			t.Errorf("both runs ran as uid %d", ua)
		}
		for _, id := range []uint32{ua, ub} {
			if id != 3000000000 && id != 3000000001 {
				t.Errorf("uid %d is outside run_uids 3000000000+2", id)
			}
		}
		if len(held) != 2 {
			t.Errorf("reservations while both ran: %v", held)
		}
		if left := reservations(t); len(left) != 0 {
			t.Errorf("reservations after the runs: %v", left)
		}
		assertNoLeaks(t)
	})
}

// TestRunUIDsExhausted: with every id of run_uids taken, a run is refused
// with an error naming the key, nothing of it left; once an id is free
// again, runs go on.
func TestRunUIDsExhausted(t *testing.T) {
	cfg := testConfig(t)
	cfg.RunUIDs = config.RunUIDs{First: 3000000000, Count: 1}
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := holdRun(t, r, loadPlan(t, cfg, "print('up', flush=True)\nimport time\ntime.sleep(60)", map[string]any{"limits": map[string]any{"timeout": "60s"}}), "up")
	res := r.Run(context.Background(), loadPlan(t, cfg, "print(1)", nil), runapi.Hooks{})
	if !strings.Contains(res.Error, "run_uids") || !strings.Contains(res.Error, "every id of the range is in use") {
		t.Errorf("run with no free uid: error %q", res.Error)
	}
	if leaks := hostLeaksExcept(a.doneID(t)); len(leaks) > 0 {
		t.Errorf("the refused run left:\n  %s", strings.Join(leaks, "\n  "))
	}
	a.end()
	mustOK(t, r.Run(context.Background(), loadPlan(t, cfg, idsLine, nil), runapi.Hooks{}))
	assertNoLeaks(t)
}

// TestRunUIDsTwoStateDirs: two agentrun processes with state dirs of
// their own (serve and a worker, say) and one range of one id: while a
// run of the first holds the id, a run of the second is refused (it got
// the same id, its reservations being its own state dir's), and the
// second's gc leaves the first's reservation alone. Once the first run
// has ended, the second runs as that id.
func TestRunUIDsTwoStateDirs(t *testing.T) {
	cfgA := testConfig(t)
	cfgA.RunUIDs = config.RunUIDs{First: 3000000000, Count: 1}
	cfgB := *cfgA
	cfgB.StateDir = filepath.Join(t.TempDir(), "state")
	rA, err := compose.Runner(cfgA, nil)
	if err != nil {
		t.Fatal(err)
	}
	rB, err := compose.Runner(&cfgB, nil)
	if err != nil {
		t.Fatal(err)
	}
	code := idsLine + "print('up', flush=True)\nimport time\ntime.sleep(60)\n"
	a := holdRun(t, rA, loadPlan(t, cfgA, code, map[string]any{"limits": map[string]any{"timeout": "60s"}}), "up")
	if uid := parseIDs(t, a.out); uid != 3000000000 {
		t.Fatalf("run A ran as %d", uid)
	}
	res := rB.Run(context.Background(), loadPlan(t, &cfgB, idsLine, nil), runapi.Hooks{})
	if !strings.Contains(res.Error, "run_uids") || !strings.Contains(res.Error, "every id of the range is in use") {
		t.Errorf("run of the second state dir while the first holds the range's one id: exit %d, error %q, stdout %q",
			res.ExitCode, res.Error, res.Stdout)
	}
	if _, err := rB.GC(); err != nil {
		t.Errorf("gc of the second state dir: %v", err)
	}
	if held := reservedBy(t, stateDir); len(held) != 1 {
		t.Errorf("the first state dir's reservations after the second's gc: %v", held)
	}
	a.end()
	res = rB.Run(context.Background(), loadPlan(t, &cfgB, idsLine, nil), runapi.Hooks{})
	mustOK(t, res)
	if uid := parseIDs(t, res.Stdout); uid != 3000000000 {
		t.Errorf("run B ran as %d", uid)
	}
	if runs, _ := os.ReadDir(filepath.Join(cfgB.StateDir, "runs")); len(runs) > 0 || len(mountPointsAt(cfgB.StateDir)) > 0 {
		t.Errorf("the second state dir holds runs %v, mounts %v", runs, mountPointsAt(cfgB.StateDir))
	}
	if held := reservedBy(t, cfgB.StateDir); len(held) != 0 {
		t.Errorf("the second state dir's reservations: %v", held)
	}
	assertNoLeaks(t)
}

// doneID is the id of the held run, the one run dir in the state dir.
func (h *heldRun) doneID(t *testing.T) string {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(stateDir, "runs"))
	if len(ents) != 1 {
		t.Fatalf("run dirs: %v", ents)
	}
	return ents[0].Name()
}

// exhaust is the python of a run that takes every inotify instance and
// POSIX message queue its user may have (fs.inotify.max_user_instances,
// RLIMIT_MSGQUEUE: both per user), holds them and sleeps.
const exhaust = `
import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while True:
    if libc.inotify_init() < 0:
        e = ctypes.get_errno()
        break
    n += 1
libc.mq_open.restype = ctypes.c_int
q = 0
while True:
    if libc.mq_open(('/q%d' % q).encode(), os.O_CREAT | os.O_RDWR, 0o600, None) < 0:
        qe = ctypes.get_errno()
        break
    q += 1
print('held', n, errno.errorcode.get(e), q, errno.errorcode.get(qe), flush=True)
time.sleep(60)
`

// tryOne is the python of a run that needs one inotify instance and one
// message queue.
const tryOne = `
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
print('inotify', 'ok' if fd >= 0 else errno.errorcode.get(ctypes.get_errno()))
libc.mq_open.restype = ctypes.c_int
q = libc.mq_open(b'/mine', os.O_CREAT | os.O_RDWR, 0o600, None)
print('mqueue', 'ok' if q >= 0 else errno.errorcode.get(ctypes.get_errno()))
`

// TestRunUIDsOwnUserLimits: a run that exhausts its user's inotify
// instances and message queue bytes does not take them from a run of
// another session going on at the same time. Under gVisor both are the
// sentry's own (and not per host user), so this is libcontainer's.
func TestRunUIDsOwnUserLimits(t *testing.T) {
	cfg := testConfig(t)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := holdRun(t, r, loadPlan(t, cfg, idsLine+exhaust, map[string]any{"session": "a", "limits": map[string]any{"timeout": "60s"}}), "held")
	var n, q int
	var e, qe string
	for _, line := range strings.Split(a.out, "\n") {
		if strings.HasPrefix(line, "held ") {
			fmt.Sscan(strings.TrimPrefix(line, "held "), &n, &e, &q, &qe)
		}
	}
	if n == 0 || e != "EMFILE" || q == 0 || qe != "EMFILE" {
		t.Fatalf("run A did not exhaust its limits: %q", a.out)
	}
	b := r.Run(context.Background(), loadPlan(t, cfg, idsLine+tryOne, map[string]any{"session": "b"}), runapi.Hooks{})
	resA := a.end()
	mustOK(t, b)
	if !strings.Contains(b.Stdout, "inotify ok\nmqueue ok\n") {
		t.Errorf("run B, while A held %d inotify instances and %d queues: %q", n, q, b.Stdout)
	}
	ua, ub := parseIDs(t, a.out), parseIDs(t, b.Stdout)
	if ua == ub || !scope.HasUID(int64(ua)) || !scope.HasUID(int64(ub)) {
		t.Errorf("uids %d and %d: want two of run_uids", ua, ub)
	}
	if !resA.TimedOut && resA.Error == "" {
		t.Logf("run A: exit %d", resA.ExitCode)
	}
	assertNoLeaks(t)
}

// TestRunUIDsSessionAcrossRuns: a kept session's files, made by one run
// and by the host, are its next run's own although each run has another
// uid: the disk keeps one owner, mapped to each run's uid.
func TestRunUIDsSessionAcrossRuns(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := sessionCfg(t, rt, "16m")
		r, id := newSession(t, cfg)
		first := runSession(t, r, cfg, id, idsLine+`
import os
os.makedirs('d/e')
open('d/e/f.txt', 'w').write('one\n')
os.chmod('d', 0o700)
os.chmod('d/e/f.txt', 0o600)
`, nil)
		mustOK(t, first)
		if err := r.Sessions().WriteFile(id, "host.txt", strings.NewReader("from host\n")); err != nil {
			t.Fatal(err)
		}
		second := runSession(t, r, cfg, id, idsLine+`
import os
me = os.getuid()
for p in ['.', 'd', 'd/e', 'd/e/f.txt', 'host.txt']:
    st = os.lstat(p)
    assert (st.st_uid, st.st_gid) == (me, os.getgid()), (p, st.st_uid, st.st_gid, me)
open('d/e/f.txt', 'a').write('two\n')
open('host.txt', 'a').write('more\n')
os.makedirs('d/e/g')
os.rename('d/e/f.txt', 'd/e/g/f.txt')
os.remove('host.txt')
os.chmod('d/e/g/f.txt', 0o640)
print(open('d/e/g/f.txt').read(), end='')
`, nil)
		mustOK(t, second)
		if u1, u2 := parseIDs(t, first.Stdout), parseIDs(t, second.Stdout); u1 == u2 {
			t.Logf("both runs had uid %d (chance: 1 in %d)", u1, scope.UIDCount)
		}
		if !strings.HasSuffix(second.Stdout, "one\ntwo\n") {
			t.Errorf("second run: %q", second.Stdout)
		}
		assertNoLeaks(t)
	})
}

// TestRunUIDsGCAfterSIGKILL: agentrun killed mid-run leaves its uid
// reserved (its program may still run as it); gc kills what is left and
// frees the uid.
func TestRunUIDsGCAfterSIGKILL(t *testing.T) {
	bin := agentrunBin(t)
	cfg := plainConfig(t)
	victim := exec.Command(bin, "run", "--config", cfg, "-")
	victim.Stdin = strings.NewReader(`{"code":"import time\ntime.sleep(30)","limits":{"timeout":"30s"}}`)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	waitForRun(t, "")
	held := reservations(t)
	if len(held) != 1 {
		t.Fatalf("reservations during the run: %v", held)
	}
	victim.Process.Signal(syscall.SIGKILL)
	victim.Wait()
	if left := reservations(t); len(left) != 1 || left[0] != held[0] {
		t.Errorf("reservations after SIGKILL, before gc: %v; want %v kept", left, held)
	}
	if err := gcCLI(t); err != nil {
		t.Fatal(err)
	}
	if left := reservations(t); len(left) != 0 {
		t.Errorf("reservations after gc: %v", left)
	}
	assertNoLeaks(t)
}

// TestRunUIDsPooled: each pooled sandbox holds its own uid from when it
// is made; a run served from the pool runs as its sandbox's uid, writes
// its workspace, and gives the uid back once torn down.
func TestRunUIDsPooled(t *testing.T) {
	p := newPooled(t, 2, pyTask("pass", nil))
	held := reservedBy(t, stateDir) // uid -> run id
	if len(held) != 2 {
		t.Fatalf("reservations of a pool of 2: %v", held)
	}
	res := p.run(pyTask(idsLine+"open('/workspace/out', 'w').write('x')\n", map[string]any{"files": map[string]any{"in.txt": map[string]string{"content": "a"}}}), true)
	uid := strconv.FormatUint(uint64(parseIDs(t, res.Stdout)), 10)
	if held[uid] != res.ID {
		t.Errorf("the pooled run %s ran as uid %s; the pool's reservations were %v", res.ID, uid, held)
	}
	if reservedBy(t, stateDir)[uid] == res.ID {
		t.Errorf("uid %s still reserved for %s after its run", uid, res.ID)
	}
}

// sandboxUID42 reports whether out is the output of
// `print(os.getuid(), 6 * 7)` in a sandbox: an id of the default run_uids
// and 42.
func sandboxUID42(out string) bool {
	var uid uint32
	var n int
	_, err := fmt.Sscanf(out, "%d %d\n", &uid, &n)
	return err == nil && n == 42 && scope.HasUID(int64(uid))
}

// TestRunUIDsHaveAName: the sandbox's own uid and gid have a name inside
// it ("sandbox"), beside the image's users, on both runtimes, so that
// programs looking their user up find one; the files stay read-only and
// nothing of one run's entry is left for the next.
func TestRunUIDsHaveAName(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := cfgFor(t, rt)
		r, err := compose.Runner(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		code := idsLine + `
import getpass, grp, pwd
print('names', pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name, getpass.getuser(), pwd.getpwnam('root').pw_uid,
      sum(l.startswith('sandbox:') for l in open('/etc/passwd')))
try:
    open('/etc/passwd', 'a').write('evil::0:0::/:/bin/sh\n')
    print('written')
except OSError:
    print('refused')
`
		// Twice: what the first run saw is not left in the image.
		for range 2 {
			res := r.Run(context.Background(), loadPlan(t, cfg, code, nil), runapi.Hooks{})
			if res.Error != "" || res.ExitCode != 0 {
				t.Fatalf("run: %+v", res)
			}
			parseIDs(t, res.Stdout)
			if !strings.Contains(res.Stdout, "names sandbox sandbox sandbox 0 1\nrefused\n") {
				t.Errorf("stdout %q; want the sandbox's names once, root kept, /etc/passwd refused", res.Stdout)
			}
		}
		assertNoLeaks(t)
	})
}
