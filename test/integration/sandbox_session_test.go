package integration

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
)

// TestServeSandboxSession: a live sandbox created with a kept session
// has the session's files as its /workspace, its processes write there
// as the sandbox's uid, and the files put through the sandbox are its
// own; while it lives the session is busy (a run of it, another sandbox
// of it and its files' API are refused 409); once it ended its files
// stay, for the session's next run. An id that is no session is 404,
// one that is not a session's id 400, both naming session. Nothing is
// left.
func TestServeSandboxSession(t *testing.T) {
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock"), "max_concurrent": 4,
		"quota": map[string]any{"concurrent": 0, "runs_per_minute": 0}},
		map[string]any{"local_images": []string{*imagesDir}})
	s := startServeWith(t, cfg)
	id := s.newSession()
	if resp, b := s.do("PUT", "/v1/sessions/"+id+"/files/before.txt", "from before"); resp.StatusCode != 204 {
		t.Fatalf("PUT a session's file: %d %s", resp.StatusCode, b)
	}
	withSession := func(session string) (int, []byte) {
		resp, b := s.do("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "session": "`+session+`"}`)
		return resp.StatusCode, b
	}
	var refused struct{ Field string }
	if code, b := withSession("ss-00000000000000000000000000000000"); code != 404 || json.Unmarshal(b, &refused) != nil || refused.Field != "session" {
		t.Errorf("a sandbox of no session: %d %s", code, b)
	}
	if code, b := withSession("mine"); code != 400 || json.Unmarshal(b, &refused) != nil || refused.Field != "session" {
		t.Errorf("a sandbox of a session that is not a kept one's id: %d %s", code, b)
	}

	code, b := withSession(id)
	var sb runapi.SandboxInfo
	if err := json.Unmarshal(b, &sb); code != 201 || err != nil {
		t.Fatalf("a sandbox of session %s: %d %s", id, code, b)
	}
	if out, exit := execOut(t, s, sb.ID, `{"cmd": "cat before.txt && echo made inside > inside.txt && stat -c %u inside.txt && id -u"}`); *exit.ExitCode != 0 {
		t.Errorf("in the session's workspace: exit %d, %q", *exit.ExitCode, out)
	} else if lines := strings.Fields(strings.TrimPrefix(out, "from before")); !strings.HasPrefix(out, "from before") || len(lines) != 2 || lines[0] != lines[1] {
		t.Errorf("the session's file, then the owner of a file made and the uid: %q", out)
	}
	if resp, b := s.do("PUT", "/v1/sandboxes/"+sb.ID+"/files/put.txt", "put through the sandbox"); resp.StatusCode != 204 {
		t.Errorf("PUT a sandbox's file: %d %s", resp.StatusCode, b)
	}
	// A file put from the host is the sandbox's own: it may change it.
	if out, exit := execOut(t, s, sb.ID, `{"cmd": "echo changed >> put.txt && cat put.txt"}`); *exit.ExitCode != 0 || out != "put through the sandbox"+"changed\n" {
		t.Errorf("a put file changed inside: exit %d, %q", *exit.ExitCode, out)
	}

	// Busy while it lives.
	run := `{"image": "` + busyboxImage + `", "command": ["cat", "inside.txt"], "session": "` + id + `", "keep_workspace": true}`
	if resp, b := s.do("POST", "/v1/runs", run); resp.StatusCode != 409 {
		t.Errorf("a run of the session while a sandbox has it: %d %s", resp.StatusCode, b)
	}
	if code, b := withSession(id); code != 409 {
		t.Errorf("a second sandbox of the session: %d %s", code, b)
	}
	if resp, b := s.do("GET", "/v1/sessions/"+id+"/files/inside.txt", ""); resp.StatusCode != 409 {
		t.Errorf("the session's file while a sandbox has it: %d %s", resp.StatusCode, b)
	}

	// Ended, its files stay.
	if resp, b := s.do("DELETE", "/v1/sandboxes/"+sb.ID, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	var res result.Result
	if resp := s.post(run, &res); resp.StatusCode != 200 || res.ExitCode != 0 || res.Stdout != "made inside\n" {
		t.Errorf("the session's next run: %d %+v", resp.StatusCode, res)
	}
	if resp, b := s.do("GET", "/v1/sessions/"+id+"/files/put.txt", ""); resp.StatusCode != 200 || string(b) != "put through the sandbox"+"changed\n" {
		t.Errorf("the file put through the sandbox, after it: %d %q", resp.StatusCode, b)
	}
	s.stop()
	assertNoLeaks(t)
}
