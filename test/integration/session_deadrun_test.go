package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/result"
)

// TestSessionAfterKilledRun: an `agentrun run` holding a kept session is
// SIGKILLed while its program runs, leaving its container running with the
// session's disk mounted. serve, which shares its state dir, finds the
// session free (the dead run's lock went with it), and its next access
// removes what the dead run left: a file read and then a run of the
// session succeed within seconds (they were refused with 409, "its disk is
// still mounted by a run that is ending", for as long as the dead run's
// program lived). The file the dead run wrote before it was killed is there.
func TestSessionAfterKilledRun(t *testing.T) {
	// A failure leaves the dead run's program running: gc kills it, after
	// the server has stopped.
	t.Cleanup(func() {
		if t.Failed() {
			gcCLI(t)
		}
	})
	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "s3cret", "max_concurrent": 2,
		"quota": map[string]any{"concurrent": 0, "runs_per_minute": 0}})
	id := s.newSession()
	task := func(code string) string {
		j, _ := json.Marshal(map[string]any{"session": id, "keep_workspace": true, "code": code})
		return string(j)
	}

	run := exec.Command(agentrunBin(t), "run", "--config", s.config, "-")
	run.Stdin = strings.NewReader(task(`open("before.txt", "w").write("written"); import time; time.sleep(600)`))
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			run.Process.Kill()
			run.Wait()
		}
	}()
	runID := waitProgram(t, "before.txt")
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	killed = true
	if !programRuns(runID) {
		t.Fatalf("the program of run %s did not outlive its agentrun: the test shows nothing", runID)
	}

	// The bound is generous for a slow shared host; the bug made it
	// the dead run's program's whole life.
	start := time.Now()
	var code int
	var body []byte
	for deadline := start.Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, b := s.do("GET", "/v1/sessions/"+id+"/files/before.txt", "")
		if code, body = resp.StatusCode, b; code == 200 || time.Now().After(deadline) {
			break
		}
	}
	if code != 200 || string(body) != "written" {
		t.Fatalf("file read after the killed run: %d %s", code, body)
	}
	t.Logf("session usable %v after its run was killed", time.Since(start).Round(time.Millisecond))
	if programRuns(runID) {
		t.Errorf("the dead run %s's program still runs", runID)
	}
	var res result.Result
	if resp := s.post(task(`print(open("before.txt").read())`), &res); resp.StatusCode != 200 || res.Stdout != "written\n" {
		t.Errorf("run after the killed run: %d %+v", resp.StatusCode, res)
	}
	s.stop()
	assertNoLeaks(t)
}

// waitProgram waits until a run's program has written its workspace file
// name (seen through the run's mount of the workspace) and returns the run's id.
func waitProgram(t *testing.T, name string) string {
	t.Helper()
	runs := filepath.Join(stateDir, "runs")
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, mp := range mountPointsAt(runs) {
			if filepath.Base(mp) != "workspace" {
				continue
			}
			if _, err := os.Stat(filepath.Join(mp, name)); err == nil {
				return filepath.Base(filepath.Dir(mp))
			}
		}
	}
	t.Fatalf("no run's program wrote %s", name)
	return ""
}

// programRuns reports whether a process of run id's cgroup is alive.
func programRuns(id string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "/"+id+"\n") {
			return true
		}
	}
	return false
}
