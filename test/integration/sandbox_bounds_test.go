package integration

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
)

// TestServeSandboxBounds: serve bounds the live sandboxes of a user
// (sandboxes.per_user, 429) and the memory their limits add up to
// (sandboxes.max_memory, 503; one past it on its own, 403), each
// refusal naming its bound, with Retry-After where waiting helps; an
// ended sandbox gives its place and memory back; nothing is left.
func TestServeSandboxBounds(t *testing.T) {
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["sandboxes"] = map[string]any{"max": 8, "per_user": 2, "max_memory": "320m"}
	s := startServeWith(t, cfg)
	create := func(memory string) (int, []byte, string) {
		resp, b := s.do("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "limits": {"memory": "`+memory+`"}}`)
		return resp.StatusCode, b, resp.Header.Get("Retry-After")
	}
	idOf := func(b []byte) string {
		var sb runapi.SandboxInfo
		if err := json.Unmarshal(b, &sb); err != nil || sb.ID == "" {
			t.Fatalf("created %s", b)
		}
		return sb.ID
	}

	// 256m of 320m: another 128m is past max_memory.
	code, b, _ := create("256m")
	if code != 201 {
		t.Fatalf("256m of 320m: %d %s", code, b)
	}
	big := idOf(b)
	if code, b, retry := create("128m"); code != 503 || retry == "" || !bytes.Contains(b, []byte("sandboxes.max_memory")) {
		t.Errorf("128m beside 256m, of 320m: %d %s (Retry-After %q)", code, b, retry)
	}
	if code, b, _ := create("400m"); code != 403 || !bytes.Contains(b, []byte("sandboxes.max_memory")) {
		t.Errorf("400m, of 320m, on its own: %d %s", code, b)
	}
	code, b, _ = create("64m")
	if code != 201 {
		t.Fatalf("64m beside 256m, of 320m: %d %s", code, b)
	}
	small := idOf(b)
	stdinBound(t, s, small)
	// Two are the user's bound (serve's every caller is one user).
	if code, b, retry := create("16m"); code != 429 || retry == "" || !bytes.Contains(b, []byte("sandboxes.per_user")) {
		t.Errorf("a third of per_user 2: %d %s (Retry-After %q)", code, b, retry)
	}
	// The 256m one ends: its place and its memory are free again.
	if resp, b := s.do("DELETE", "/v1/sandboxes/"+big, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	if code, b, _ := create("256m"); code != 201 {
		t.Errorf("256m beside 64m, of 320m, once the other ended: %d %s", code, b)
	}
	s.stop()
	assertNoLeaks(t)
}

// stdinBound: one write to a process's stdin takes at most
// server.MaxStdinBytes (1 MiB): one byte more is refused 413 naming
// data, and nothing of it reaches the process; 1 MiB does, whole.
func stdinBound(t *testing.T, s *served, id string) {
	t.Helper()
	resp, b := s.do("POST", "/v1/sandboxes/"+id+"/processes?wait=false", `{"cmd": "wc -c", "stdin": true}`)
	var started struct{ Pid int }
	if err := json.Unmarshal(b, &started); resp.StatusCode != 200 || err != nil || started.Pid <= 0 {
		t.Fatalf("wc -c in the background: %d %s", resp.StatusCode, b)
	}
	proc := "/v1/sandboxes/" + id + "/processes/" + strconv.Itoa(started.Pid)
	write := func(n int, close bool) (int, []byte) {
		body, _ := json.Marshal(map[string]any{"data_b64": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), n)), "close": close})
		resp, b := s.do("POST", proc+"/stdin", string(body))
		return resp.StatusCode, b
	}
	var refused struct{ Field string }
	if code, b := write(server.MaxStdinBytes+1, true); code != 413 || json.Unmarshal(b, &refused) != nil || refused.Field != "data" {
		t.Errorf("a write of 1 MiB + 1 byte: %d %s", code, b)
	}
	if code, b := write(server.MaxStdinBytes, true); code != 204 {
		t.Errorf("a write of 1 MiB: %d %s", code, b)
	}
	var out string
	for _, ev := range sandboxStream(t, s, "GET", proc+"/events", "", nil) {
		if ev.Event == "stdout" {
			out += ev.Data
		}
	}
	if strings.TrimSpace(out) != strconv.Itoa(server.MaxStdinBytes) {
		t.Errorf("wc -c read %q, want %d", out, server.MaxStdinBytes)
	}
}
