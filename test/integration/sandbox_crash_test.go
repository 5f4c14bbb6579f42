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
)

// TestLiveSandboxGCAfterSIGKILL: serve killed while a live sandbox runs
// processes (one in the background, a shell on a terminal) leaves
// nothing of agentrun's running on the host (on runsc, no `runsc exec`
// outlives serve), and `agentrun gc` removes the rest: the sandbox, its
// cgroup, mounts, state.
func TestLiveSandboxGCAfterSIGKILL(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock")},
			map[string]any{"local_images": []string{*imagesDir}})
		cfg["runtime"] = rt
		s := startServeWith(t, cfg)
		a := createSandbox(t, s)
		for _, body := range []string{`{"cmd": "sleep 1000"}`, `{"command": ["/bin/sh"], "tty": {"rows": 24, "cols": 80}}`} {
			resp, b := s.do("POST", "/v1/sandboxes/"+a.ID+"/processes?wait=false", body)
			var started struct{ Pid int }
			if err := json.Unmarshal(b, &started); resp.StatusCode != 200 || err != nil || started.Pid <= 0 {
				t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
			}
		}
		s.cmd.Process.Signal(syscall.SIGKILL)
		s.cmd.Wait()
		stop := make(chan struct{})
		defer close(stop)
		go reapOrphans(stop)

		// Nothing agentrun started on the host runs on (zombies aside,
		// which their new parent reaps).
		var left []string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			left = hostProcessesOf(stateDir, " exec ")
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("left running after serve's SIGKILL: %q", left)
		}
		gcCfg := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "audit": "",
			"runsc": map[string]any{"path": runscPath, "flags": []string{}}})
		if out, err := exec.Command(agentrunBin(t), "gc", "--config", gcCfg).CombinedOutput(); err != nil {
			t.Fatalf("agentrun gc: %v\n%s", err, out)
		}
		assertNoLeaks(t)
	})
}

// hostProcessesOf lists the host processes, zombies aside, whose command
// line holds every one of words.
func hostProcessesOf(words ...string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		st, err := os.ReadFile(p + "/stat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) == 0 || f[0] == "Z" {
			continue
		}
		b, err := os.ReadFile(p + "/cmdline")
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		all := true
		for _, w := range words {
			all = all && strings.Contains(cmd, w)
		}
		if all && cmd != "" {
			out = append(out, cmd)
		}
	}
	return out
}
