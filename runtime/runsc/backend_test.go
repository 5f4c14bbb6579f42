package runsc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
	"github.com/agentrun/agentrun/test/testenv"
)

// These tests run real gVisor sandboxes: they need root, runsc (from
// test/runsc.sh, or $AGENTRUN_RUNSC) and the python image rootfs
// (test/images/build.sh). Anything missing fails the test loudly.

const pythonRootfs = "/var/cache/agentrun/images/python/rootfs"

// testParent holds this test process's run cgroups, apart from those of
// any agentrun running beside the tests.
var testParent = fmt.Sprintf("%s-test-%d", CgroupParent, os.Getpid())

func runscBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("AGENTRUN_RUNSC")
	if p == "" {
		dir := os.Getenv("AGENTRUN_RUNSC_DIR")
		if dir == "" {
			dir = "/var/cache/agentrun/bin"
		}
		p = filepath.Join(dir, "runsc")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("runsc is not installed at %s (run test/runsc.sh or set $AGENTRUN_RUNSC): %v", p, err)
	}
	return p
}

type fixture struct {
	b        *Backend
	stateDir string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	testenv.RequireRoot(t)
	if _, err := os.Stat(filepath.Join(pythonRootfs, "usr/bin/python3")); err != nil {
		t.Fatalf("python rootfs missing (run test/images/build.sh): %v", err)
	}
	// Short: runsc puts unix sockets under its root dir.
	dir, err := os.MkdirTemp("", "rsc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b, err := New(runscBinary(t), nil, dir, testParent)
	if err != nil {
		t.Fatal(err)
	}
	// Runs keep the parent cgroup: the test's end removes it.
	t.Cleanup(func() { b.RemoveCgroupParent() })
	return &fixture{b: b, stateDir: dir}
}

type runOpts struct {
	memory  int64
	timeout time.Duration
	limit   int64
	stdin   string
}

// withDefaults is o with its zero fields set to the tests' defaults.
func (o runOpts) withDefaults() runOpts {
	if o.memory == 0 {
		o.memory = 256 << 20
	}
	if o.timeout == 0 {
		o.timeout = 20 * time.Second
	}
	if o.limit == 0 {
		o.limit = 64 << 10
	}
	return o
}

func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

// container builds the spec the way internal/runner does.
func (f *fixture) container(t *testing.T, o runOpts, argv ...string) *backend.Container {
	t.Helper()
	o = o.withDefaults()
	ws := t.TempDir()
	if err := os.Chown(ws, spec.UID, spec.GID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	id := newID()
	s, err := spec.New(pythonRootfs,
		spec.WithArgs(argv...),
		spec.WithEnv(map[string]string{"LANG": "C.UTF-8"}),
		spec.WithCgroupsPath(testParent+"/"+id),
		spec.WithMemory(o.memory),
		spec.WithCPUs(1),
		spec.WithPids(64),
		spec.WithTmpSize(64<<20, 64<<20),
		spec.WithWorkspace(ws),
		spec.WithSeccomp(),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(s); err != nil {
		t.Fatal(err)
	}
	return &backend.Container{ID: id, Spec: s}
}

// runIn prepares c, runs its program with o's stdin, timeout and output
// cap, and destroys it, as the runner does.
func (f *fixture) runIn(c *backend.Container, o runOpts) (out *backend.Outcome, err error) {
	o = o.withDefaults()
	p, err := f.b.Prepare(context.Background(), c)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := p.Destroy(); derr != nil && err == nil {
			err = derr
		}
	}()
	return p.Exec(context.Background(), backend.Program{Stdin: []byte(o.stdin), Timeout: o.timeout, OutputLimit: o.limit})
}

// run runs python code and checks that the run left nothing behind.
func (f *fixture) run(t *testing.T, o runOpts, code string) *backend.Outcome {
	t.Helper()
	c := f.container(t, o, "python3", "-c", code)
	out, err := f.runIn(c, o)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	f.checkClean(t, c.ID)
	return out
}

// checkClean fails if anything of run id is left: a process, a cgroup, the
// bundle or runsc's state.
func (f *fixture) checkClean(t *testing.T, id string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(f.stateDir, id)); !os.IsNotExist(err) {
		t.Errorf("bundle dir of %s left (stat: %v)", id, err)
	}
	if left, _ := os.ReadDir(f.b.root); len(left) > 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("runsc state left: %v", names)
	}
	for _, pattern := range []string{"/sys/fs/cgroup/*" + testParent + "/" + id, "/sys/fs/cgroup" + testParent + "/" + id} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("cgroups left: %v", m)
		}
	}
	if pids := processesMentioning(id, f.stateDir); len(pids) > 0 {
		t.Errorf("processes left: %v", pids)
	}
	// New made this process the reaper of the sandboxes.
	if z := testenv.Zombies(os.Getpid()); len(z) > 0 {
		t.Errorf("children left unreaped: %v", z)
	}
}

// processesMentioning lists processes whose command line contains any of words.
func processesMentioning(words ...string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		for _, w := range words {
			if strings.Contains(cmd, w) {
				out = append(out, filepath.Base(d)+": "+cmd)
				break
			}
		}
	}
	return out
}

func TestPrint(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{}, "print(45)")
	if string(out.Stdout.Data) != "45\n" || out.ExitCode != 0 || out.TimedOut || out.OOMKilled || out.Signal != "" {
		t.Fatalf("got %+v, stderr %q", out, out.Stderr.Data)
	}
	if out.CPU <= 0 || out.MemoryPeak <= 0 || out.Duration <= 0 {
		t.Errorf("usage missing: cpu %v peak %d duration %v", out.CPU, out.MemoryPeak, out.Duration)
	}
	t.Logf("print(45): %v wall, %v cpu, %d MiB peak (whole sandbox)", out.Duration, out.CPU, out.MemoryPeak>>20)
}

func TestExitCode(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{}, "import sys; sys.stderr.write('bye'); sys.exit(3)")
	if out.ExitCode != 3 || string(out.Stderr.Data) != "bye" || out.Signal != "" {
		t.Fatalf("got exit %d signal %q stderr %q", out.ExitCode, out.Signal, out.Stderr.Data)
	}
	out = f.run(t, runOpts{}, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
	if out.ExitCode != 128+15 || out.Signal != "SIGTERM" {
		t.Fatalf("self-SIGTERM: got exit %d signal %q", out.ExitCode, out.Signal)
	}
}

// TestGVisor proves the program talks to gVisor's kernel, not the host's.
func TestGVisor(t *testing.T) {
	f := newFixture(t)
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	hostRelease := unix.ByteSliceToString(host.Release[:])
	out := f.run(t, runOpts{}, "import platform; print(platform.release()); print(open('/proc/version').read())")
	lines := strings.SplitN(string(out.Stdout.Data), "\n", 2)
	if out.ExitCode != 0 || len(lines) < 2 {
		t.Fatalf("got %+v, stderr %q", out, out.Stderr.Data)
	}
	t.Logf("sandbox release %q, /proc/version %q; host release %q", lines[0], strings.TrimSpace(lines[1]), hostRelease)
	if lines[0] == hostRelease {
		t.Errorf("sandbox kernel release %q is the host's", lines[0])
	}
	// gVisor names itself where Linux names its build.
	if !strings.Contains(strings.ToLower(lines[0]), "gvisor") || !strings.Contains(strings.ToLower(lines[1]), "gvisor") {
		t.Errorf("no gVisor marker in release %q or /proc/version %q", lines[0], lines[1])
	}
	// The kernel log is closed to the sandbox (syslog needs CAP_SYSLOG,
	// which the seccomp profile enforces inside gVisor too).
	c := f.container(t, runOpts{}, "dmesg")
	dm, err := f.runIn(c, runOpts{})
	if err != nil {
		t.Fatal(err)
	}
	f.checkClean(t, c.ID)
	if dm.ExitCode == 0 || !strings.Contains(string(dm.Stderr.Data), "Operation not permitted") {
		t.Errorf("dmesg: exit %d, stdout %q, stderr %q", dm.ExitCode, dm.Stdout.Data, dm.Stderr.Data)
	}
}

func TestReadonlyRoot(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{}, `
import errno, os
for p in ['/x', '/usr/x', '/var/tmp/x', '/workspace/ok', '/tmp/ok']:
    try:
        open(p, 'w').write('x'); print(p, 'ok')
    except OSError as e:
        print(p, errno.errorcode[e.errno])
try:
    os.chmod('/usr/bin/python3', 0o777); print('chmod ok')
except OSError as e:
    print('chmod', errno.errorcode[e.errno])`)
	got := string(out.Stdout.Data)
	t.Logf("writes: %q", got)
	// gVisor checks permissions before the read-only mount: nobody gets
	// EACCES in a root-owned directory where Linux (runc) says EROFS. A
	// world-writable directory of the image (/var/tmp) shows EROFS.
	for _, want := range []string{"/x EACCES", "/usr/x EACCES", "/var/tmp/x EROFS", "/workspace/ok ok", "/tmp/ok ok", "chmod EPERM"} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("want %q in %q (stderr %q)", want, got, out.Stderr.Data)
		}
	}
}

// TestNetworkNamespace runs a sandbox in a network namespace given by path:
// runsc (--network=sandbox) takes over its interfaces.
func TestNetworkNamespace(t *testing.T) {
	f := newFixture(t)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err) // the thread stays locked and dies with the test
	}
	runtime.UnlockOSThread()
	orig.Close()
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// A veth pair inside the namespace (dummy links need a module).
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}
	if err := h.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.77.0.2/24")
	if err := h.AddrAdd(dummy, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(dummy); err != nil {
		t.Fatal(err)
	}

	code := "import socket; print(sorted(n for _, n in socket.if_nameindex()))"
	c := f.container(t, runOpts{}, "python3", "-c", code)
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns))
	if err := spec.WithNetworkNamespace(path)(c.Spec); err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(c.Spec); err != nil {
		t.Fatal(err)
	}
	out, err := f.runIn(c, runOpts{})
	if err != nil {
		t.Fatal(err)
	}
	f.checkClean(t, c.ID)
	if got := string(out.Stdout.Data); !strings.Contains(got, "'probe0'") {
		t.Errorf("joined netns: interfaces %q, stderr %q", got, out.Stderr.Data)
	}
	// Without a path: loopback only.
	out = f.run(t, runOpts{}, code)
	if got := string(out.Stdout.Data); got != "['lo']\n" {
		t.Errorf("no netns: interfaces %q, stderr %q", got, out.Stderr.Data)
	}
}

func TestTimeout(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{timeout: time.Second}, "import time; print('start', flush=True); time.sleep(60)")
	if !out.TimedOut || out.ExitCode != 137 || out.Signal != "SIGKILL" {
		t.Fatalf("got timed_out %v exit %d signal %q", out.TimedOut, out.ExitCode, out.Signal)
	}
	if string(out.Stdout.Data) != "start\n" {
		t.Errorf("stdout %q", out.Stdout.Data)
	}
	// From the program's start (the sandbox's boot before it is not
	// counted) to its end: the timeout, and the kill's bounded wait at
	// most, not the program's minute.
	if out.Duration < time.Second || out.Duration > time.Second+startWait+killGrace {
		t.Errorf("the 1s timeout ended the program after %v", out.Duration)
	}
}

// TestCancel: a run whose context is cancelled while its program runs
// (it has written "started", and runsc start has ended) is killed,
// reports "run cancelled" with its outcome, and leaves nothing.
func TestCancel(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "python3", "-c", "import time; print('started', flush=True); time.sleep(60)")
	p := f.prepare(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	start := time.Now()
	out, err := p.Exec(ctx, backend.Program{Timeout: time.Minute, OutputLimit: 1000, Output: func(stream string, data []byte) {
		if stream == "stdout" && strings.Contains(string(data), "started") {
			once.Do(func() { go cancelAfterStart(c.ID, cancel) })
		}
	}})

	if err == nil || !strings.Contains(err.Error(), "run cancelled") || out == nil || string(out.Stdout.Data) != "started\n" {
		t.Fatalf("got %+v, %v", out, err)
	}
	// Killed at the cancel, not at the minute's timeout.
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the cancelled run took %v", took)
	}
}

// cancelAfterStart calls cancel once no `runsc start` of container id runs.
func cancelAfterStart(id string, cancel func()) {
	for slices.ContainsFunc(processesMentioning(id), func(p string) bool { return strings.Contains(p, " start "+id) }) {
		time.Sleep(time.Millisecond)
	}
	cancel()
}

func TestOOM(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{memory: 128 << 20},
		"x = []\nwhile True: x.append(bytearray(b'x' * (1 << 20)))")
	if !out.OOMKilled || out.ExitCode != 137 {
		t.Fatalf("got oom %v exit %d signal %q stderr %q", out.OOMKilled, out.ExitCode, out.Signal, out.Stderr.Data)
	}
	if out.MemoryPeak > 130<<20 {
		t.Errorf("peak %d above the 128 MiB limit", out.MemoryPeak)
	}
	t.Logf("oom: exit %d signal %q peak %d MiB", out.ExitCode, out.Signal, out.MemoryPeak>>20)
}

func TestOutputCap(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{limit: 1000}, "import sys; sys.stdout.write('x' * 100000); sys.stderr.write('y' * 10)")
	if len(out.Stdout.Data) != 1000 || out.Stdout.Total != 100000 || !out.Stdout.Truncated {
		t.Errorf("stdout: kept %d total %d truncated %v", len(out.Stdout.Data), out.Stdout.Total, out.Stdout.Truncated)
	}
	if string(out.Stderr.Data) != "yyyyyyyyyy" || out.Stderr.Truncated {
		t.Errorf("stderr: %+v", out.Stderr)
	}
}

func TestStdin(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{stdin: "hello\nworld"}, "import sys; print(sys.stdin.read().upper())")
	if string(out.Stdout.Data) != "HELLO\nWORLD\n" {
		t.Fatalf("got %q stderr %q", out.Stdout.Data, out.Stderr.Data)
	}
	// No stdin: EOF at once.
	out = f.run(t, runOpts{}, "import sys; print(repr(sys.stdin.read()))")
	if string(out.Stdout.Data) != "''\n" {
		t.Fatalf("got %q stderr %q", out.Stdout.Data, out.Stderr.Data)
	}
}

func TestBadProgram(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "/no/such/program")
	out, err := f.runIn(c, runOpts{})
	t.Logf("missing program: %v; %+v", err, out)
	if err == nil || out != nil || !strings.Contains(err.Error(), "/no/such/program") {
		t.Fatalf("missing program: want an error naming it and no outcome, got %v, %+v", err, out)
	}
	f.checkClean(t, c.ID)
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	_, err := New("/no/such/runsc", nil, dir, "")
	if err == nil || !strings.Contains(err.Error(), "runsc not found at /no/such/runsc (config key runsc.path)") {
		t.Errorf("missing binary: %v", err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(plain, nil, dir, ""); err == nil || !strings.Contains(err.Error(), "runsc.path") {
		t.Errorf("non-executable: %v", err)
	}
	bin := runscBinary(t)
	for _, flags := range [][]string{{"--network=host"}, {"-root=/x"}, {"--TESTONLY-unsafe-nonroot"}, {"platform=kvm"}} {
		if _, err := New(bin, flags, dir, ""); err == nil || !strings.Contains(err.Error(), "runsc.flags") {
			t.Errorf("flags %v: %v", flags, err)
		}
	}
	b, err := New(bin, []string{"--platform=systrap"}, dir, "")
	if err != nil {
		t.Fatal(err)
	}
	args := b.globalArgs(&backend.Container{ID: "x", Spec: spec.Default("/r")}, "/b")
	if !slices.Contains(args, "--network=none") || !slices.Contains(args, "--oci-seccomp") || args[len(args)-1] != "--platform=systrap" {
		t.Errorf("args %v", args)
	}
}

// TestLatency reports the median wall time of a print(45) run.
func TestLatency(t *testing.T) {
	f := newFixture(t)
	var ds []time.Duration
	for range 10 {
		start := time.Now()
		out := f.run(t, runOpts{}, "print(45)")
		ds = append(ds, time.Since(start))
		if string(out.Stdout.Data) != "45\n" {
			t.Fatalf("got %q", out.Stdout.Data)
		}
	}
	slices.Sort(ds)
	t.Logf("print(45) with runsc: median %v (min %v, max %v) over %d runs", (ds[4]+ds[5])/2, ds[0], ds[9], len(ds))
}

// TestConcurrent runs sandboxes side by side under the shared parent cgroup,
// whose cgroups go away with them; the parent stays, for the next run,
// until RemoveCgroupParent.
func TestConcurrent(t *testing.T) {
	f := newFixture(t)
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			c := f.container(t, runOpts{}, "python3", "-c", fmt.Sprintf("print(%d)", i))
			out, err := f.runIn(c, runOpts{})
			if err == nil && string(out.Stdout.Data) != fmt.Sprintf("%d\n", i) {
				err = fmt.Errorf("run %d: stdout %q stderr %q", i, out.Stdout.Data, out.Stderr.Data)
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for _, pattern := range []string{"/sys/fs/cgroup/*" + testParent + "/*/", "/sys/fs/cgroup" + testParent + "/*/"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("run cgroups left: %v", m)
		}
	}
	if err := f.b.RemoveCgroupParent(); err != nil {
		t.Fatal(err)
	}
	for _, pattern := range []string{"/sys/fs/cgroup/*" + testParent, "/sys/fs/cgroup" + testParent} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			t.Errorf("empty parent cgroups left by RemoveCgroupParent: %v", m)
		}
	}
	if left, _ := os.ReadDir(f.b.root); len(left) > 0 {
		t.Errorf("runsc state left: %d entries", len(left))
	}
}

// TestShortTimeout kills the sandbox while the program is still starting
// up (the timeout runs from its start on): the run is reported timed out
// (or finished), and nothing is left behind.
func TestShortTimeout(t *testing.T) {
	f := newFixture(t)
	for _, d := range []time.Duration{time.Millisecond, 30 * time.Millisecond, 60 * time.Millisecond, 90 * time.Millisecond} {
		o := runOpts{timeout: d}
		c := f.container(t, o, "python3", "-c", "print(45)")
		out, err := f.runIn(c, o)
		switch {
		case err != nil:
			t.Errorf("timeout %v: %v", d, err)
		case !out.TimedOut:
			t.Logf("timeout %v: finished first (%v)", d, out.Duration)
		case out.ExitCode != 137 || out.Signal != "SIGKILL":
			t.Errorf("timeout %v: exit %d signal %q", d, out.ExitCode, out.Signal)
		}
		f.checkClean(t, c.ID)
	}
}

// TestPrepareCancelledDuringCreate stops Prepare while `runsc create` is
// still booting the sandbox: the sandbox's processes, cgroup, bundle and
// runsc's state are all gone when Prepare returns its error, and no
// process of runsc create's is left unreaped. The cancels are spread over
// the time one create takes here, so that they land in each of its steps
// whatever the host's speed.
func TestPrepareCancelledDuringCreate(t *testing.T) {
	f := newFixture(t)
	// The second of two creates: the first also fills the page cache.
	var create time.Duration
	for range 2 {
		c := f.container(t, runOpts{}, "python3", "-c", "print(45)")
		start := time.Now()
		p, err := f.b.Prepare(context.Background(), c)
		create = time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Destroy(); err != nil {
			t.Fatal(err)
		}
		f.checkClean(t, c.ID)
	}
	const steps = 10
	for round := range 2 {
		for i := range steps + 1 {
			d := create * time.Duration(i) / steps
			c := f.container(t, runOpts{}, "python3", "-c", "print(45)")
			ctx, cancel := context.WithTimeout(context.Background(), d)
			p, err := f.b.Prepare(ctx, c)
			cancel()
			if err == nil {
				t.Logf("round %d, cancel after %v of a %v create: created first", round, d, create)
				if err := p.Destroy(); err != nil {
					t.Error(err)
				}
			} else if !strings.Contains(err.Error(), "creating the sandbox") {
				t.Errorf("cancel after %v: %v", d, err)
			}
			f.checkClean(t, c.ID)
		}
	}
}

// TestCommandLeavesNoChild: a runsc command that is cancelled, or that
// ends, leaving processes it started in its process group (as runsc
// create killed between a fork and its child's exec or setsid does)
// leaves none of them running or unreaped: agentrun, their reaper, kills
// and reaps them.
func TestCommandLeavesNoChild(t *testing.T) {
	newFixture(t) // agentrun the reaper of orphans, as New makes it
	b := &Backend{path: "/bin/sh"}
	for _, cancelled := range []bool{true, false} {
		t.Run(fmt.Sprintf("cancelled=%v", cancelled), func(t *testing.T) {
			// A duration no other process sleeps names the children.
			sleep := fmt.Sprintf("sleep 60.%d", time.Now().UnixNano()%1e9)
			started := filepath.Join(t.TempDir(), "started")
			// Their output elsewhere: a child holding the command's
			// pipe holds its Wait (up to killGrace).
			script := sleep + " >/dev/null 2>&1 & " + sleep + " >/dev/null 2>&1 & touch " + started
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if cancelled {
				script += "; wait"
				go func() {
					for _, err := os.Stat(started); err != nil; _, err = os.Stat(started) {
						time.Sleep(time.Millisecond)
					}
					cancel()
				}()
			}
			_, err := b.command(ctx, nil, nil, "-c", script)
			if cancelled != (err != nil) {
				t.Errorf("command: %v", err)
			}
			if left := processesMentioning(sleep); len(left) > 0 {
				t.Errorf("processes left: %v", left)
			}
			if z := testenv.Zombies(os.Getpid()); len(z) > 0 {
				t.Errorf("children left unreaped: %v", z)
			}
		})
	}
}

// TestSeccompErrno pins a difference from libcontainer: gVisor's
// --oci-seccomp answers every SCMP_ACT_ERRNO rule with EPERM, ignoring the
// rule's errnoRet. Docker's profile refuses clone3 with ENOSYS so that
// glibc falls back to clone; under gVisor it gets EPERM, glibc does not fall
// back, and no thread can be started. If this test starts failing, gVisor
// has changed: update the expectation (and the runtime's known limits).
func TestSeccompErrno(t *testing.T) {
	f := newFixture(t)
	out := f.run(t, runOpts{}, `
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(435, 0, 0)
print('clone3', os.strerror(ctypes.get_errno()))
try:
    threading.Thread(target=print).start(); print('thread ok')
except RuntimeError as e:
    print('thread', e)`)
	got := string(out.Stdout.Data)
	if got != "clone3 Operation not permitted\nthread can't start new thread\n" {
		t.Errorf("gVisor seccomp errno behaviour changed: %q (stderr %q)", got, out.Stderr.Data)
	}
}

// TestSpecOptClone3 runs the runsc spec's filter (SpecOpt): clone3 fails
// with ENOSYS, with namespace flags or without, so that no program makes
// a user namespace (it made one with every capability in gVisor's
// kernel, and a raw socket there, when clone3 was allowed), and glibc
// falls back to clone, so threads and fork still work.
func TestSpecOptClone3(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "python3", "-c", `
import ctypes, errno, os, struct, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
for flags in (0, 0x10000000 | 0x40000000):  # CLONE_NEWUSER | CLONE_NEWNET
    args = ctypes.create_string_buffer(struct.pack('8Q', flags, 0, 0, 0, 17, 0, 0, 0), 64)
    pid = libc.syscall(ctypes.c_long(435), args, ctypes.c_long(64))
    if pid == 0:
        caps = [l for l in open('/proc/self/status') if l.startswith('CapEff')]
        os.write(1, ('child ' + caps[0]).encode())
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
        print('clone3', hex(flags), 'made a child')
    else:
        print('clone3', hex(flags), errno.errorcode[ctypes.get_errno()])
t = threading.Thread(target=print, args=('thread ok',))
t.start()
t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))`)
	if err := SpecOpt()(c.Spec); err != nil {
		t.Fatal(err)
	}
	out, err := f.runIn(c, runOpts{})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	f.checkClean(t, c.ID)
	want := "clone3 0x0 ENOSYS\nclone3 0x50000000 ENOSYS\nthread ok\nfork 7\n"
	if got := string(out.Stdout.Data); got != want {
		t.Errorf("stdout %q; want %q (stderr %q)", got, want, out.Stderr.Data)
	}
}
