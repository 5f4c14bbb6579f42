package integration

import (
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/test/testenv"
)

// The pool on runtime runsc: the same guarantees as on libcontainer, for
// sandboxes that `runsc create` booted ahead and Run starts.

// runscTask is pyTask on runtime runsc.
func runscTask(code string, extra map[string]any) string {
	m := map[string]any{"runtime": "runsc"}
	for k, v := range extra {
		m[k] = v
	}
	return pyTask(code, m)
}

// TestPoolRunscEnforcesLimits: the pooled runsc sandbox is as locked down
// as a cold one: read-only root, pids cap, memory cap with the OOM kill
// reported.
func TestPoolRunscEnforcesLimits(t *testing.T) {
	limits := map[string]any{"limits": map[string]any{"memory": "128m", "pids": 16}}
	p := newPooled(t, 1, runscTask("pass", limits))

	res := p.run(runscTask(`try:
    open("/hacked", "w")
except OSError as e:
    print("denied", e.errno)`, limits), true)
	if !strings.HasPrefix(res.Stdout, "denied ") {
		t.Errorf("write to /: %q", res.Stdout)
	}

	assertPoolCaps(t, p, runscTask, limits)
}

// runscSandboxPids are the processes in the cgroups of runsc runs: with a
// pool full and no run going on, the ready sandboxes and their gofers.
func runscSandboxPids(t *testing.T) []int { return runProcesses(t, runscParent()) }

// TestPoolRunscDropsDeadSandboxes: a pooled runsc sandbox killed while it
// waited is dropped, and the run goes cold instead of failing; one that is
// stopped does not hold the run either.
func TestPoolRunscDropsDeadSandboxes(t *testing.T) {
	p := newPooled(t, 1, runscTask("pass", nil))
	for _, pid := range runscSandboxPids(t) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	if res := p.run(runscTask("print(6 * 7)", nil), false); res.Stdout != "42\n" {
		t.Fatalf("run after the kill printed %q (stderr %q)", res.Stdout, res.Stderr)
	}
	p.waitReady(1)
	if res := p.run(runscTask("print(6 * 7)", nil), true); res.Stdout != "42\n" {
		t.Fatalf("pooled run printed %q", res.Stdout)
	}

	p.waitReady(1)
	for _, pid := range runscSandboxPids(t) {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	start := time.Now()
	if res := p.run(runscTask("print(6 * 7)", nil), false); res.Stdout != "42\n" {
		t.Fatalf("run after the stop printed %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the run took %v", took)
	}
}

// runscServeConfig is a serve config whose tasks run on runsc by default,
// with a pool of n for the python image.
func runscServeConfig(t *testing.T, sock string, n int) map[string]any {
	cfg := serveConfig(map[string]any{"listen": "unix://" + sock, "pool": map[string]int{pythonImage: n}},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["runtime"] = "runsc"
	return cfg
}

// gcRunsc runs `agentrun gc` with runsc at path: runscPath, as the server
// had it, or one where there is no runsc (uninstalled since, or another
// config), which must clean up all the same.
func gcRunsc(t *testing.T, path string) {
	t.Helper()
	cfg := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "audit": "",
		"runsc": map[string]any{"path": path, "flags": []string{}}})
	if out, err := exec.Command(agentrunBin(t), "gc", "--config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("agentrun gc: %v\n%s", err, out)
	}
}

// TestServeSIGKILLThenGCRunsc: a server killed with its pool of runsc
// sandboxes full leaves created sandboxes behind, which outlive it (runsc
// create detaches them); `agentrun gc` removes every one of them, their
// processes, cgroups, bundles and runsc's state, even when its config
// names no runsc binary that exists. So it does for a server killed while
// it fills its pool, at random points of `runsc create`, with and without
// a runsc binary.
func TestServeSIGKILLThenGCRunsc(t *testing.T) {
	s := startServeWith(t, runscServeConfig(t, filepath.Join(t.TempDir(), "k.sock"), 2))
	var res struct{ Stdout, Runtime string }
	if resp := s.post(`{"code": "print(6 * 7)"}`, &res); resp.StatusCode != 200 || res.Stdout != "42\n" || res.Runtime != "runsc" {
		t.Fatalf("status %d, %+v", resp.StatusCode, res)
	}
	// The server reaps the sandboxes it ran and tore down: no zombie
	// child is left once the run's tear-down is over.
	var zombies []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if zombies = testenv.Zombies(s.cmd.Process.Pid); len(zombies) == 0 {
			break
		}
	}
	if len(zombies) > 0 {
		t.Errorf("the server left unreaped children: %v", zombies)
	}
	pids := runscSandboxPids(t)
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	time.Sleep(100 * time.Millisecond)
	alive := 0
	for _, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			alive++
		}
	}
	if alive == 0 {
		t.Fatal("no pooled sandbox outlived the server; the test cannot see what gc must remove")
	}
	gcRunsc(t, filepath.Join(t.TempDir(), "no-runsc-here"))
	assertNoLeaks(t)

	for i := range 4 {
		cmd := exec.Command(agentrunBin(t), "serve", "--config", writeConfig(t, runscServeConfig(t, filepath.Join(t.TempDir(), "f.sock"), 2)))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(300+rand.IntN(1200)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		path := runscPath
		if i%2 == 1 {
			path = filepath.Join(t.TempDir(), "no-runsc-here")
		}
		gcRunsc(t, path)
		if leaks := hostLeaks(); len(leaks) > 0 {
			t.Fatalf("iteration %d: left after gc:\n  %s", i, strings.Join(leaks, "\n  "))
		}
	}
}
