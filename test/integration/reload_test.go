package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
)

// hup writes cfg to s's config file, sends serve SIGHUP and waits for
// its log line about it, which must hold want.
func (s *served) hup(cfg map[string]any, want string) {
	s.t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(s.config, b, 0o600); err != nil {
		s.t.Fatal(err)
	}
	n := strings.Count(s.log(), "SIGHUP")
	s.cmd.Process.Signal(syscall.SIGHUP)
	for deadline := time.Now().Add(10 * time.Second); strings.Count(s.log(), "SIGHUP") == n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("no log line after SIGHUP: %s", s.log())
		}
	}
	lines := strings.Split(strings.TrimSpace(s.log()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, want) {
		s.t.Fatalf("after SIGHUP: %q, want %q", last, want)
	}
}

// TestServeReloadAppliesTools: a SIGHUP that changes tools and
// tool_limits applies them to the runs that come next, the runner's side
// as well as the API's: a rule now held for approval holds the call (no
// one to ask: denied at once), tool_limits.calls bounds the run's calls,
// a tool server the reload added is usable by a run at once, and one it
// removed is refused at the door with a 403 naming the field. A reload
// that also changes a key only a restart applies is refused as a whole,
// naming that key: its tool server is not added.
func TestServeReloadAppliesTools(t *testing.T) {
	entry := everythingEntry(t)
	command := []string{nodePath(t), entry, "stdio"}
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "r.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["tools"] = map[string]any{"ev": map[string]any{"command": command, "rules": []map[string]any{{"tools": []string{"get-sum", "echo"}}}}}
	s := startServeWith(t, cfg)

	// echo now held for approval, ev2 added, two calls per run.
	cfg["tools"] = map[string]any{
		"ev":  map[string]any{"command": command, "rules": []map[string]any{{"tools": []string{"get-sum"}}, {"tools": []string{"echo"}, "approve": true}}},
		"ev2": map[string]any{"command": command, "rules": []map[string]any{{"tools": []string{"get-sum"}}}},
	}
	cfg["tool_limits"] = map[string]any{"calls": 2}
	s.hup(cfg, "reloaded")
	code := toolPy
	for _, c := range []string{`call("echo", message="held")`, `call_on("ev2", "get-sum", a=1, b=2)`, `call("get-sum", a=3, b=4)`} {
		code += "print(" + c + ", flush=True)\n"
	}
	b, _ := json.Marshal(map[string]any{"code": code, "tools": []string{"ev", "ev2"}, "limits": map[string]any{"timeout": "60s"}})
	var res result.Result
	if resp := s.post(string(b), &res); resp.StatusCode != 200 || res.Error != "" {
		t.Fatalf("a run of ev and the added ev2 after the reload: status %d, %+v", resp.StatusCode, res)
	}
	want := "403 denied by the operator: no way to ask (the call needs approval)\n" +
		"200 The sum of 1 and 2 is 3.\n" +
		"429 calls per run spent: 2 made (tool_limits.calls)\n"
	if res.Stdout != want {
		t.Errorf("stdout %q; want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	if calls := toolCallsOf(t, &res); len(calls) != 3 || calls[0].Approval == "" || calls[0].By != "no way to ask" {
		t.Errorf("tools.calls %+v; want echo held first", calls)
	}

	// ev2 removed: refused at the door, as policy, naming the field.
	delete(cfg["tools"].(map[string]any), "ev2")
	s.hup(cfg, "reloaded")
	var apiErr server.APIError
	ev2 := `{"code": "print(1)", "tools": ["ev2"]}`
	if resp := s.post(ev2, &apiErr); resp.StatusCode != 403 || apiErr.Field != "tools[0]" {
		t.Errorf("ev2 after its removal: status %d %+v; want 403 on tools[0]", resp.StatusCode, apiErr)
	}

	// ev2 again, beside a new state_dir: refused as a whole.
	refused := map[string]any{}
	for k, v := range cfg {
		refused[k] = v
	}
	refused["tools"] = map[string]any{"ev": cfg["tools"].(map[string]any)["ev"],
		"ev2": map[string]any{"command": command, "rules": []map[string]any{{"tools": []string{"get-sum"}}}}}
	refused["state_dir"] = filepath.Join(t.TempDir(), "elsewhere")
	s.hup(refused, "refused, the old one stays: state_dir changed, which takes a restart")
	if resp := s.post(ev2, &apiErr); resp.StatusCode != 403 || apiErr.Field != "tools[0]" {
		t.Errorf("ev2 after a refused reload: status %d %+v; want 403 on tools[0]", resp.StatusCode, apiErr)
	}
	s.stop()
	if pids := serverProcesses(entry); len(pids) > 0 {
		t.Errorf("tool server processes left: %v", pids)
	}
	assertNoLeaks(t)
}
