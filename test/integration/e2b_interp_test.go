package integration

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/e2b/interp"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/task"
)

// interpSandbox is a live sandbox of image on a fresh runner, with its
// code interpreter served at the URL it returns the way E2B's SDKs reach
// a sandbox's port 49999 (E2B_SANDBOX_URL and the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers), beside the least of E2B's control API that
// Sandbox.create and kill call, naming that one sandbox. Everything is
// closed, and the host checked clean, when the test ends.
func interpSandbox(t *testing.T, image string) (string, runapi.Sandbox) {
	t.Helper()
	cfg := testConfig(t)
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	door := sandbox.NewDoor(r, 4)
	plan, err := task.Load([]byte(`{"image": "`+image+`", "command": ["true"], "limits": {"memory": "1g", "pids": 256}}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := door.Create(context.Background(), plan, "alice", 5*time.Minute, 10*time.Minute)
	if err != nil {
		t.Fatalf("creating a live sandbox: %v", err)
	}
	set := interp.NewSet()
	const token = "access-t0ken"
	id := sb.Info().ID
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if sid := req.Header.Get("E2b-Sandbox-Id"); sid != "" {
			if sid != id || req.Header.Get("E2b-Sandbox-Port") != "49999" {
				http.Error(w, "no such sandbox or port", http.StatusNotFound)
				return
			}
			if req.Header.Get("X-Access-Token") != token && req.Header.Get("E2B-Traffic-Access-Token") != token {
				http.Error(w, "no access token", http.StatusUnauthorized)
				return
			}
			set.For(sb).ServeHTTP(w, req)
			return
		}
		switch {
		case req.Method == http.MethodPost && req.URL.Path == "/v2/sandboxes":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"sandboxID": id, "templateID": "code-interpreter-v1",
				"clientID": "agentrun", "envdVersion": "0.5.0", "envdAccessToken": token, "trafficAccessToken": token})
		case req.Method == http.MethodDelete && req.URL.Path == "/sandboxes/"+id:
			w.WriteHeader(http.StatusNoContent)
		default:
			http.Error(w, "not this test's", http.StatusNotFound)
		}
	}))
	t.Cleanup(func() {
		srv.Close()
		set.Drop(id)
		if err := sb.Close(); err != nil {
			t.Errorf("closing the sandbox: %v", err)
		}
		r.Close()
		assertNoLeaks(t)
	})
	return srv.URL, sb
}

// TestE2BCodeInterpreter: the real @e2b/code-interpreter's runCode and
// contexts against a live sandbox of the python-data image
// (test/e2b-client/interp.mjs): a value, streamed prints, state kept
// from cell to cell, an exception's name, value and traceback, a
// matplotlib figure as PNG, a pandas frame as HTML, the other formats,
// env vars, a cell past the SDK's timeout interrupted, contexts made
// (cwd), listed, restarted, removed, a language without an interpreter
// refused with a message, and frames that the code prints read as its
// stdout, never as results.
func TestE2BCodeInterpreter(t *testing.T) {
	url, sb := interpSandbox(t, pythonData(t))
	dir := npmPackages(t, "e2b-client", "@e2b/code-interpreter")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "interp.mjs"))
	cmd.Env = append(cmd.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY=e2b_test",
		"E2B_DOMAIN=localhost")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "all passed") {
		t.Fatalf("interp.mjs: %v\n%s", err, out)
	}
	t.Logf("interp.mjs:\n%s", out)
	// Each context is a process of the sandbox, in its process list.
	n := 0
	for _, p := range sb.Processes() {
		if p.Running && len(p.Command) == 2 && p.Command[1] == interp.ReplPath {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d context interpreters running after the script; want the default one", n)
	}
}
