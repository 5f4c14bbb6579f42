package integration

import (
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGCAfterSIGKILL kills agentrun at random points of a run, 50 times,
// runs `agentrun gc` after each, and checks that nothing is left, while
// another agentrun's run goes on untouched throughout.
func TestGCAfterSIGKILL(t *testing.T) {
	bin := agentrunBin(t)
	cfg := plainConfig(t)

	// The live run: it must survive every gc below.
	live := exec.Command(bin, "run", "--config", cfg, "-")
	live.Stdin = strings.NewReader(`{"code":"import time\nfor i in range(500):\n    time.sleep(0.1)\nprint('survived')","limits":{"timeout":"55s"}}`)
	var liveOut strings.Builder
	live.Stdout = &liveOut
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// On failure too: let the live agentrun clean up after itself.
		live.Process.Signal(syscall.SIGTERM)
		live.Wait()
	}()
	liveID := waitForRun(t, "")
	liveCgroup := hostCgroupOf(liveID)

	for i := range 50 {
		victim := exec.Command(bin, "run", "--config", cfg, "-")
		victim.Stdin = strings.NewReader(`{"code":"import time\nprint('x', flush=True)\ntime.sleep(5)","limits":{"timeout":"30s"}}`)
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.IntN(250)) * time.Millisecond)
		victim.Process.Signal(syscall.SIGKILL)
		victim.Wait()

		out, err := exec.Command(bin, "gc", "--config", cfg).CombinedOutput()
		if err != nil {
			t.Fatalf("iteration %d: agentrun gc: %v\n%s", i, err, out)
		}
		if leaks := hostLeaksExcept(liveID); len(leaks) > 0 {
			t.Fatalf("iteration %d: left after gc:\n  %s", i, strings.Join(leaks, "\n  "))
		}
		if _, err := os.Stat(liveCgroup); err != nil {
			t.Fatalf("iteration %d: gc touched the live run: %v", i, err)
		}
	}

	live.Process.Signal(syscall.SIGTERM)
	if err := live.Wait(); err == nil {
		t.Error("live run exited 0 after SIGTERM")
	}
	if !strings.Contains(liveOut.String(), "cancelled") {
		t.Errorf("live run result: %s", liveOut.String())
	}
	assertNoLeaks(t)
}

// waitForRun waits until a run other than not appears in the state dir
// and its container has a cgroup, and returns its id.
func waitForRun(t *testing.T, not string) string {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		entries, _ := os.ReadDir(filepath.Join(stateDir, "runs"))
		for _, e := range entries {
			if e.Name() != not {
				if _, err := os.Stat(hostCgroupOf(e.Name())); err == nil {
					return e.Name()
				}
			}
		}
	}
	t.Fatal("no run started within 15s")
	return ""
}

// hostCgroupOf is the pids cgroup of libcontainer run id, under v1 or v2.
func hostCgroupOf(id string) string { return hostCgroupUnder(lcParent(), id) }

// hostCgroupUnder is the pids cgroup of run id under parent, under v1 or v2.
func hostCgroupUnder(parent, id string) string {
	if _, err := os.Stat("/sys/fs/cgroup/pids"); err == nil {
		return filepath.Join("/sys/fs/cgroup/pids", parent, id)
	}
	return filepath.Join("/sys/fs/cgroup", parent, id)
}

// TestGCAfterSIGKILLRunsc: a runsc run's cgroup is under cgroup_parent-runsc,
// where the README and runsc's own gc say, never under libcontainer's
// cgroup_parent; agentrun killed mid-run, `agentrun gc` removes it, the
// sandbox's processes and everything else.
func TestGCAfterSIGKILLRunsc(t *testing.T) {
	bin := agentrunBin(t)
	cfg := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "audit": "",
		"runsc": map[string]any{"path": runscPath, "flags": []string{}}})
	for i := range 3 {
		victim := exec.Command(bin, "run", "--config", cfg, "-")
		victim.Stdin = strings.NewReader(`{"runtime":"runsc","code":"import time\nprint('x', flush=True)\ntime.sleep(30)","limits":{"timeout":"50s"}}`)
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		var id string
		for deadline := time.Now().Add(30 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			entries, _ := os.ReadDir(filepath.Join(stateDir, "runs"))
			for _, e := range entries {
				if _, err := os.Stat(hostCgroupUnder(runscParent(), e.Name())); err == nil {
					id = e.Name()
				}
			}
		}
		if id == "" {
			victim.Process.Kill()
			victim.Wait()
			t.Fatalf("iteration %d: no runsc run's cgroup appeared under %s within 30s", i, runscParent())
		}
		if _, err := os.Stat(hostCgroupOf(id)); err == nil {
			t.Errorf("iteration %d: runsc run %s has a cgroup under libcontainer's parent too", i, id)
		}
		victim.Process.Signal(syscall.SIGKILL)
		victim.Wait()
		if out, err := exec.Command(bin, "gc", "--config", cfg).CombinedOutput(); err != nil {
			t.Fatalf("iteration %d: agentrun gc: %v\n%s", i, err, out)
		}
		if leaks := hostLeaks(); len(leaks) > 0 {
			t.Fatalf("iteration %d: left after gc:\n  %s", i, strings.Join(leaks, "\n  "))
		}
	}
	assertNoLeaks(t)
}
