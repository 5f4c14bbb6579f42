package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/runapi"
)

// createSandbox makes a live sandbox of the busybox image over s's API.
func createSandbox(t *testing.T, s *served) runapi.SandboxInfo {
	t.Helper()
	before := time.Now()
	resp, b := s.do("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "timeout": "2m"}`)
	var sb runapi.SandboxInfo
	if err := json.Unmarshal(b, &sb); resp.StatusCode != 201 || err != nil {
		t.Fatalf("POST /v1/sandboxes: %d %s", resp.StatusCode, b)
	}
	// A dir: image has no digest ("" as in a run's result).
	if !regexp.MustCompile(`^sb-[0-9a-f]{32}$`).MatchString(sb.ID) || sb.Image != "" || len(sb.PreviewToken) != 32 {
		t.Errorf("created %+v", sb)
	}
	if life := sb.ExpiresAt.Sub(before); life < time.Minute || life > 2*time.Minute+time.Second {
		t.Errorf("a sandbox of timeout 2m expires in %v", life)
	}
	return sb
}

// sandboxStream sends method path with body to s and reads its NDJSON
// answer event by event, calling on with each until it says stop or
// the answer ends; it returns the events read. The whole answer is
// checked against the OpenAPI document.
func sandboxStream(t *testing.T, s *served, method, path, body string, on func(runapi.ProcessEvent) bool) []runapi.ProcessEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var all bytes.Buffer
	var evs []runapi.ProcessEvent
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		all.Write(append(sc.Bytes(), '\n'))
		var ev runapi.ProcessEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("%s %s: event %q: %v", method, path, sc.Text(), err)
		}
		evs = append(evs, ev)
		if on != nil && !on(ev) {
			break
		}
	}
	checkAnswer(t, method, req.URL.Path, resp, all.Bytes())
	return evs
}

// execOut runs body's process to its end and returns its stdout and
// its exit event.
func execOut(t *testing.T, s *served, id, body string) (string, runapi.ProcessEvent) {
	t.Helper()
	outs, exit := execOutputs(t, s, id, body)
	return outs["stdout"], exit
}

// execOutputs runs body's process to its end and returns its output by
// event (stdout, stderr, pty) and its exit event.
func execOutputs(t *testing.T, s *served, id, body string) (map[string]string, runapi.ProcessEvent) {
	t.Helper()
	evs := sandboxStream(t, s, "POST", "/v1/sandboxes/"+id+"/processes", body, nil)
	outs := map[string]string{}
	for _, ev := range evs {
		if ev.Event != "start" && ev.Event != "exit" {
			outs[ev.Event] += ev.Data
		}
	}
	if len(evs) == 0 || evs[len(evs)-1].Event != "exit" || evs[len(evs)-1].ExitCode == nil {
		t.Fatalf("process %s: no exit event last: %+v", body, evs)
	}
	return outs, evs[len(evs)-1]
}

// TestServeLiveSandboxes: over serve's API a live sandbox is created, a
// process's output streams as it comes (start, stdout, exit), it runs as
// the sandbox's uid, one in the background is attached to, fed its stdin
// and signalled, files go in and out, a forged id is none, DELETE leaves
// nothing on the host, sandboxes.max refuses one more, and SIGTERM ends
// every live sandbox, leaving nothing.
func TestServeLiveSandboxes(t *testing.T) { eachRuntime(t, testServeLiveSandboxes) }

func testServeLiveSandboxes(t *testing.T, rt string) {
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["runtime"] = rt
	cfg["sandboxes"] = map[string]any{"max": 2}
	s := startServeWith(t, cfg)
	a := createSandbox(t, s)
	sb := "/v1/sandboxes/" + a.ID

	// A process streams: start, then its output, then its exit.
	evs := sandboxStream(t, s, "POST", sb+"/processes", `{"cmd": "echo hi"}`, nil)
	if len(evs) != 3 || evs[0].Event != "start" || evs[0].Pid <= 0 ||
		evs[1].Event != "stdout" || evs[1].Data != "hi\n" ||
		evs[2].Event != "exit" || evs[2].ExitCode == nil || *evs[2].ExitCode != 0 {
		t.Errorf("echo hi streamed %+v", evs)
	}
	out, exit := execOut(t, s, a.ID, `{"command": ["id", "-u"]}`)
	uid, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil || *exit.ExitCode != 0 || uid == 0 || !scope.HasUID(uid) {
		t.Errorf("id -u in the sandbox: %q (exit %d): not one of the sandboxes' uids", out, *exit.ExitCode)
	}
	if _, exit := execOut(t, s, a.ID, `{"cmd": "exit 7"}`); *exit.ExitCode != 7 {
		t.Errorf("exit 7 ended %d", *exit.ExitCode)
	}

	// In the background: its pid at once; attached to, fed, signalled.
	resp, b := s.do("POST", sb+"/processes?wait=false",
		`{"cmd": "trap 'echo int; exit 3' INT; read line; echo got:$line; while :; do sleep 1; done", "stdin": true}`)
	var started struct{ Pid int }
	if err := json.Unmarshal(b, &started); resp.StatusCode != 200 || err != nil || started.Pid <= 0 {
		t.Fatalf("?wait=false: %d %s", resp.StatusCode, b)
	}
	proc := fmt.Sprintf("%s/processes/%d", sb, started.Pid)
	if resp, b := s.do("POST", proc+"/stdin", `{"data": "x\n"}`); resp.StatusCode != 204 {
		t.Errorf("stdin: %d %s", resp.StatusCode, b)
	}
	var list struct{ Processes []runapi.ProcessInfo }
	if s.get(sb+"/processes", &list); len(list.Processes) != 4 || list.Processes[3].Pid != started.Pid || !list.Processes[3].Running {
		t.Errorf("processes: %+v", list.Processes)
	}
	signalled := false
	evs = sandboxStream(t, s, "GET", proc+"/events", "", func(ev runapi.ProcessEvent) bool {
		if ev.Event == "stdout" && strings.Contains(ev.Data, "got:x\n") && !signalled {
			signalled = true
			if resp, b := s.do("POST", proc+"/signal", `{"signal": "SIGINT"}`); resp.StatusCode != 204 {
				t.Errorf("signal: %d %s", resp.StatusCode, b)
			}
		}
		return true
	})
	var printed strings.Builder
	for _, ev := range evs {
		printed.WriteString(ev.Data)
	}
	last := evs[len(evs)-1]
	if !signalled || evs[0].Event != "start" || printed.String() != "got:x\nint\n" || last.Event != "exit" || *last.ExitCode != 3 {
		t.Errorf("attached: signalled %v, printed %q, events %+v", signalled, printed.String(), evs)
	}
	if resp, _ := s.do("POST", proc+"/signal", `{"signal": "SIGINT"}`); resp.StatusCode != 409 {
		t.Errorf("a signal to an ended process: %d, want 409", resp.StatusCode)
	}
	if resp, _ := s.do("POST", proc+"/stdin", `{"data": "y"}`); resp.StatusCode != 409 {
		t.Errorf("stdin of an ended process: %d, want 409", resp.StatusCode)
	}

	// Files: in, seen inside, listed, out, removed.
	if resp, b := s.do("PUT", sb+"/files/dir/a.txt", "hello"); resp.StatusCode != 204 {
		t.Fatalf("PUT: %d %s", resp.StatusCode, b)
	}
	if out, _ := execOut(t, s, a.ID, `{"cmd": "cat a.txt", "cwd": "dir"}`); out != "hello" {
		t.Errorf("the sandbox reads %q", out)
	}
	execOut(t, s, a.ID, `{"cmd": "echo made > /workspace/dir/b.txt; ln -s /etc/passwd /workspace/dir/link"}`)
	if resp, b := s.do("GET", sb+"/files/dir/b.txt", ""); resp.StatusCode != 200 || string(b) != "made\n" {
		t.Errorf("GET a file the sandbox made: %d %q", resp.StatusCode, b)
	}
	if resp, b := s.do("GET", sb+"/files/dir/link", ""); resp.StatusCode != 400 || bytes.Contains(b, []byte("root:")) {
		t.Errorf("GET a link: %d %.200s; want 400", resp.StatusCode, b)
	}
	var files []runapi.FileInfo
	s.get(sb+"/files/dir?list=1", &files)
	if len(files) != 3 || files[0].Name != "a.txt" || files[0].Type != "file" || files[0].Size != 5 || files[2].Type != "symlink" {
		t.Errorf("list: %+v", files)
	}
	if resp, _ := s.do("DELETE", sb+"/files/dir/a.txt", ""); resp.StatusCode != 204 {
		t.Errorf("DELETE a file: %d", resp.StatusCode)
	}
	if resp, _ := s.do("GET", sb+"/files/dir/a.txt", ""); resp.StatusCode != 404 {
		t.Errorf("GET a removed file: %d, want 404", resp.StatusCode)
	}

	// A forged id, or a pid of none of its processes, is none.
	forged := "/v1/sandboxes/sb-" + strings.Repeat("0", 32)
	for _, op := range [][3]string{{"GET", forged, ""}, {"DELETE", forged, ""}, {"POST", forged + "/processes", `{"cmd": "true"}`},
		{"GET", forged + "/files/dir/b.txt", ""}, {"POST", forged + "/timeout", `{"timeout": "1m"}`}, {"GET", sb + "/processes/1/events", ""}} {
		if resp, b := s.do(op[0], op[1], op[2]); resp.StatusCode != 404 {
			t.Errorf("%s %s: %d %s, want 404", op[0], op[1], resp.StatusCode, b)
		}
	}
	var mine struct{ Sandboxes []runapi.SandboxInfo }
	if s.get("/v1/sandboxes", &mine); len(mine.Sandboxes) != 1 || mine.Sandboxes[0].ID != a.ID {
		t.Errorf("GET /v1/sandboxes: %+v", mine)
	}
	resp, b = s.do("POST", sb+"/timeout", `{"timeout": "10m"}`)
	var moved runapi.SandboxInfo
	if err := json.Unmarshal(b, &moved); resp.StatusCode != 200 || err != nil || time.Until(moved.ExpiresAt) < 9*time.Minute {
		t.Errorf("timeout 10m: %d %s", resp.StatusCode, b)
	}
	if resp, _ := s.do("POST", sb+"/timeout", `{"timeout": "2h"}`); resp.StatusCode != 400 {
		t.Errorf("timeout past the max lifetime: %d, want 400", resp.StatusCode)
	}

	// DELETE ends it, and leaves nothing.
	if resp, b := s.do("DELETE", sb, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	if resp, _ := s.do("GET", sb, ""); resp.StatusCode != 404 {
		t.Errorf("GET an ended sandbox: %d, want 404", resp.StatusCode)
	}
	assertNoLeaks(t)

	// sandboxes.max is 2: a third is refused, naming the bound.
	createSandbox(t, s)
	b2 := createSandbox(t, s)
	resp, b = s.do("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`"}`)
	if resp.StatusCode != 503 || !bytes.Contains(b, []byte("sandboxes.max")) {
		t.Errorf("a third sandbox of 2: %d %s", resp.StatusCode, b)
	}
	resp, b = s.do("POST", "/v1/sandboxes/"+b2.ID+"/processes?wait=false", `{"cmd": "while :; do sleep 1; done"}`)
	if resp.StatusCode != 200 {
		t.Errorf("a background process: %d %s", resp.StatusCode, b)
	}
	_, metrics := s.do("GET", "/metrics", "")
	for _, want := range []string{"\nagentrun_sandboxes_live 2\n", "\nagentrun_sandbox_processes_total{outcome=\"ok\"} 4\n",
		"\nagentrun_sandbox_processes_total{outcome=\"exit_nonzero\"} 2\n"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// SIGTERM ends both, their processes too, and leaves nothing.
	s.stop()
	assertNoLeaks(t)
}
