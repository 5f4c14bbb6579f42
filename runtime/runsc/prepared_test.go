package runsc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// prepare creates c's sandbox, and destroys it and checks that nothing is
// left when the test ends.
func (f *fixture) prepare(t *testing.T, c *backend.Container) backend.Prepared {
	t.Helper()
	p, err := f.b.Prepare(context.Background(), c)
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		f.checkClean(t, c.ID)
	})
	return p
}

// workspaceOf is the host dir bound at /workspace in c.
func workspaceOf(t *testing.T, c *backend.Container) string {
	t.Helper()
	for _, m := range c.Spec.Mounts {
		if m.Destination == spec.WorkspaceDir {
			return m.Source
		}
	}
	t.Fatal("no workspace mount")
	return ""
}

// sandboxPids are the processes in run id's cgroup: the sandbox and its
// gofer once created.
func sandboxPids(t *testing.T, id string) []int {
	t.Helper()
	cg, err := cgroup.Open(testParent + "/" + id)
	if err != nil {
		t.Fatal(err)
	}
	pids := cg.Pids()
	if len(pids) == 0 {
		t.Fatalf("no process in the cgroup of %s", id)
	}
	return pids
}

// TestPreparedSandboxWaits: a prepared sandbox is booted and waits: its
// program has not run (the file it would write is not there), it is
// Ready, and Run then starts it with the stdin, timeout and output cap
// given to Run, and files written to the workspace after Prepare. It runs
// once.
func TestPreparedSandboxWaits(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "python3", "-c", `import sys
open("/workspace/ran", "w").write("yes")
print(open("/workspace/task.txt").read() + sys.stdin.read())
print("x" * 5000)`)
	p := f.prepare(t, c)
	sandboxPids(t, c.ID)
	time.Sleep(300 * time.Millisecond)
	ws := workspaceOf(t, c)
	if _, err := os.Stat(filepath.Join(ws, "ran")); !os.IsNotExist(err) {
		t.Fatalf("the program ran before Run (stat: %v)", err)
	}
	if !p.Ready() {
		t.Fatal("a prepared sandbox is not Ready")
	}
	if err := os.WriteFile(filepath.Join(ws, "task.txt"), []byte("hello "), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := p.Exec(context.Background(), backend.Program{Stdin: []byte("world"), Timeout: 20 * time.Second, OutputLimit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out.Stdout.Data), "hello world\n") || len(out.Stdout.Data) != 100 || !out.Stdout.Truncated || out.ExitCode != 0 {
		t.Fatalf("got exit %d stdout %q (truncated %v), stderr %q", out.ExitCode, out.Stdout.Data, out.Stdout.Truncated, out.Stderr.Data)
	}
	if out.CPU <= 0 || out.MemoryPeak <= 0 {
		t.Errorf("usage missing: cpu %v peak %d", out.CPU, out.MemoryPeak)
	}
	if p.Ready() {
		t.Error("Ready after Run")
	}
	if _, err := p.Exec(context.Background(), backend.Program{Timeout: time.Second, OutputLimit: 100}); err == nil {
		t.Error("a second Run succeeded")
	}
}

// TestPreparedDestroyedUnrun: a sandbox destroyed without a run leaves
// nothing, and its program never ran.
func TestPreparedDestroyedUnrun(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "python3", "-c", `open("/workspace/ran", "w").write("yes")`)
	p, err := f.b.Prepare(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	pids := sandboxPids(t, c.ID)
	if err := p.Destroy(); err != nil {
		t.Fatal(err)
	}
	f.checkClean(t, c.ID)
	for _, pid := range pids {
		if err := unix.Kill(pid, 0); err == nil {
			if b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cgroup")); strings.Contains(string(b), c.ID) {
				t.Errorf("sandbox process %d alive after Destroy", pid)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(workspaceOf(t, c), "ran")); !os.IsNotExist(err) {
		t.Errorf("the program ran (stat: %v)", err)
	}
}

// TestPreparedSandboxKilled: a prepared sandbox whose processes were
// killed while it waited is not Ready, and Run reports ErrNotStarted (the
// pool then runs the task cold) without an outcome.
func TestPreparedSandboxKilled(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "python3", "-c", "print(45)")
	p := f.prepare(t, c)
	for _, pid := range sandboxPids(t, c.ID) {
		unix.Kill(pid, unix.SIGKILL)
	}
	for deadline := time.Now().Add(5 * time.Second); p.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Ready 5s after the sandbox was killed")
		}
	}
	out, err := p.Exec(context.Background(), backend.Program{Timeout: 20 * time.Second, OutputLimit: 100})
	if !errors.Is(err, backend.ErrNotStarted) || out != nil {
		t.Fatalf("Run of a killed sandbox: %+v, %v; want ErrNotStarted", out, err)
	}
}

// TestPreparedSandboxStopped: a prepared sandbox that cannot take the
// start (its processes stopped) does not hold the run until its timeout:
// Run gives up after startWait with ErrNotStarted.
func TestPreparedSandboxStopped(t *testing.T) {
	f := newFixture(t)
	c := f.container(t, runOpts{}, "python3", "-c", "print(45)")
	p := f.prepare(t, c)
	for _, pid := range sandboxPids(t, c.ID) {
		unix.Kill(pid, unix.SIGSTOP)
	}
	start := time.Now()
	out, err := p.Exec(context.Background(), backend.Program{Timeout: 60 * time.Second, OutputLimit: 100})
	if !errors.Is(err, backend.ErrNotStarted) || out != nil {
		t.Fatalf("Run of a stopped sandbox: %+v, %v; want ErrNotStarted", out, err)
	}
	if took := time.Since(start); took > startWait+killGrace+5*time.Second {
		t.Errorf("Run took %v", took)
	}
}
