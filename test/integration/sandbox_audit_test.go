package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/runapi"
)

// sandboxRecords reads the audit log at path and returns its sandboxes'
// records by id.
func sandboxRecords(t *testing.T, path string) map[string][]audit.Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	out := map[string][]audit.Record{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, audit.MaxRecordBytes)
	for sc.Scan() {
		var rec audit.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		if rec.Kind == audit.KindSandbox {
			out[rec.ID] = append(out[rec.ID], rec)
		}
	}
	return out
}

// TestServeSandboxAudit: a live sandbox's audit record is on the log
// before DELETE answers, one per sandbox: its id, image, limits, usage,
// and each process with its exit, a command of an ESC and a newline
// escaped; one that expires writes one too, and so does one that serve's
// stop ends.
func TestServeSandboxAudit(t *testing.T) { eachRuntime(t, testServeSandboxAudit) }

func testServeSandboxAudit(t *testing.T, rt string) {
	log := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["audit"] = log
	cfg["runtime"] = rt
	s := startServeWith(t, cfg)

	a := createSandbox(t, s)
	hostile := "\x1b[2J\nDONE"
	body, _ := json.Marshal(runapi.ExecRequest{Command: []string{"printf", "%s", hostile}})
	if out, exit := execOut(t, s, a.ID, string(body)); out != hostile || *exit.ExitCode != 0 {
		t.Errorf("printf: %q, exit %d", out, *exit.ExitCode)
	}
	if _, exit := execOut(t, s, a.ID, `{"cmd": "exit 7"}`); *exit.ExitCode != 7 {
		t.Errorf("exit 7 ended %d", *exit.ExitCode)
	}
	if _, exit := execOut(t, s, a.ID, `{"cmd": "kill -9 $$"}`); exit.Signal != "SIGKILL" {
		t.Errorf("kill -9 $$ ended %+v", exit)
	}
	if n := len(sandboxRecords(t, log)[a.ID]); n != 0 {
		t.Fatalf("%d records of a live sandbox", n)
	}
	if resp, b := s.do("DELETE", "/v1/sandboxes/"+a.ID, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	recs := sandboxRecords(t, log)[a.ID]
	if len(recs) != 1 {
		t.Fatalf("%d records of sandbox %s once DELETE answered; want 1", len(recs), a.ID)
	}
	rec := recs[0]
	// serve has one token, so one user, "" (callerOf).
	if rec.User != "" || rec.Ended != "deleted" || rec.Runtime != rt || rec.Limits.Values["memory"] <= 0 ||
		rec.DurationMS <= 0 || rec.MemoryPeakBytes <= 0 || rec.ProcessesNotListed != 0 || rec.Network.Allowed == nil {
		t.Errorf("record %+v", rec)
	}
	if len(rec.Processes) != 3 {
		t.Fatalf("processes %+v; want 3", rec.Processes)
	}
	p := rec.Processes[0]
	if !slices.Equal(p.Command, []string{"printf", "%s", `\x1b[2J\nDONE`}) || p.ExitCode != 0 || p.Pid <= 1 || p.Started.IsZero() {
		t.Errorf("printf's record %+v; want its command escaped", p)
	}
	if line, _ := os.ReadFile(log); bytes.ContainsAny(line, "\x1b") || strings.Contains(string(line), `\u001b`) {
		t.Errorf("the log holds the ESC raw or JSON-escaped: %q", line)
	}
	if p := rec.Processes[1]; p.ExitCode != 7 || !slices.Equal(p.Command, []string{"/bin/sh", "-c", "exit 7"}) {
		t.Errorf("exit 7's record %+v", p)
	}
	if p := rec.Processes[2]; p.Signal != "SIGKILL" || p.ExitCode != 137 {
		t.Errorf("kill -9's record %+v", p)
	}

	// One that expires writes its record as it ends.
	resp, b := s.do("POST", "/v1/sandboxes", `{"image": "`+busyboxImage+`", "timeout": "3s"}`)
	var e runapi.SandboxInfo
	if err := json.Unmarshal(b, &e); resp.StatusCode != 201 || err != nil {
		t.Fatalf("POST /v1/sandboxes: %d %s", resp.StatusCode, b)
	}
	if _, exit := execOut(t, s, e.ID, `{"cmd": "sleep 600", "timeout": "1s"}`); !exit.TimedOut {
		t.Errorf("sleep 600 of timeout 1s: %+v", exit)
	}
	deadline := time.Now().Add(time.Minute)
	for len(sandboxRecords(t, log)[e.ID]) == 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	recs = sandboxRecords(t, log)[e.ID]
	if len(recs) != 1 || recs[0].Ended != "expired" || len(recs[0].Processes) != 1 || !recs[0].Processes[0].TimedOut {
		t.Errorf("records of the sandbox that expired: %+v", recs)
	}

	// serve's stop ends one, and writes its record.
	c := createSandbox(t, s)
	s.do("POST", "/v1/sandboxes/"+c.ID+"/processes?wait=false", `{"cmd": "sleep 600"}`)
	s.stop()
	recs = sandboxRecords(t, log)[c.ID]
	if len(recs) != 1 || recs[0].Ended != "server stopped" || len(recs[0].Processes) != 1 || recs[0].Processes[0].Signal != "SIGKILL" {
		t.Errorf("records of the sandbox serve's stop ended: %+v", recs)
	}
	if n := len(sandboxRecords(t, log)); n != 3 {
		t.Errorf("records of %d sandboxes; want 3", n)
	}
	assertNoLeaks(t)
}
