package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/result"
)

// A run that collects 100,000 files with long names, and fails with a
// long error, writes one record of at most MaxRecordBytes that says what
// it cut (such a record used to be several megabytes).
func TestRecordIsBounded(t *testing.T) {
	rec := &Record{ID: "ar-1", Error: strings.Repeat("e", 1<<20), Detail: strings.Repeat("d", 1<<20)}
	for i := range 100000 {
		rec.Files = append(rec.Files, fmt.Sprintf("out/%06d-%s", i, strings.Repeat("n", 200)))
	}
	for i := range 300 {
		rec.Network.Denied = append(rec.Network.Denied, result.Denied{Host: fmt.Sprintf("h%d.%s", i, strings.Repeat("x", 500)), Reason: strings.Repeat("r", 500)})
		rec.Limits.NetworkAllow = append(rec.Limits.NetworkAllow, strings.Repeat("a", 250))
	}
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Write(rec); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxRecordBytes || strings.Count(string(b), "\n") != 1 {
		t.Fatalf("record is %d bytes, %d lines; want one line of at most %d", len(b), strings.Count(string(b), "\n"), MaxRecordBytes)
	}
	var got Record
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Truncated == nil || got.Truncated.Files != 100000 || got.Truncated.NetworkDenied != 300 || got.Truncated.NetworkAllow != 300 {
		t.Errorf("truncated = %+v; want the full counts", got.Truncated)
	}
	if len(got.Files) == 0 || len(got.Error) > maxText || len(got.Detail) > maxText || !strings.HasSuffix(got.Error, "…(cut)") {
		t.Errorf("kept %d files, error %d bytes, detail %d bytes", len(got.Files), len(got.Error), len(got.Detail))
	}
	if len(rec.Files) != 100000 || len(rec.Error) != 1<<20 {
		t.Error("the caller's record was changed")
	}
	// A small record is written whole.
	small := &Record{ID: "ar-2", Files: []string{"a", "b"}}
	line, err := marshalBounded(small)
	if err != nil || strings.Contains(string(line), "truncated") {
		t.Errorf("small record: %s %v", line, err)
	}
}

// A run of many service requests with long paths (each within
// proxy.MaxURLBytes) writes one bounded record: paths that fit are whole,
// and when the record is too long each is cut with a mark and the SHA-256
// of the whole, and the lists are halved, saying how long they were.
func TestRecordServiceRequestsBounded(t *testing.T) {
	long := "/api/write/" + strings.Repeat("p", 2000)
	few := &Record{ID: "ar-1"}
	few.Network.Requests = []result.ServiceRequest{{Service: "api", Method: "POST", Path: long}}
	few.Network.Approvals = []result.Approval{{ID: "ap-1", Service: "api", Method: "POST", URL: "https://api.test" + long}}
	line, err := marshalBounded(few)
	if err != nil || !strings.Contains(string(line), `"path":"`+long+`"`) || !strings.Contains(string(line), `"url":"https://api.test`+long+`"`) {
		t.Fatalf("a record with one long path: %v, path not whole: %.200s", err, line)
	}
	many := &Record{ID: "ar-2"}
	for i := range 1000 {
		many.Network.Requests = append(many.Network.Requests, result.ServiceRequest{Service: "api", Method: "POST", Path: fmt.Sprintf("%s/%d", long, i), Reason: strings.Repeat("r", 2100)})
		many.Network.Approvals = append(many.Network.Approvals, result.Approval{ID: "ap", Service: "api", Method: "POST", URL: fmt.Sprintf("https://api.test%s/%d", long, i)})
		many.Network.Failed = append(many.Network.Failed, result.Failed{Host: "h", Reason: strings.Repeat("f", 2000)})
	}
	line, err = marshalBounded(many)
	if err != nil || len(line) > MaxRecordBytes {
		t.Fatalf("a record of 1000 long requests: %d bytes, %v", len(line), err)
	}
	var got Record
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	if tr := got.Truncated; tr == nil || tr.NetworkRequests != 1000 || tr.NetworkApprovals != 1000 || tr.NetworkFailed != 1000 {
		t.Errorf("truncated = %+v; want the full counts", got.Truncated)
	}
	if len(got.Network.Requests) == 0 || len(got.Network.Approvals) == 0 {
		t.Fatalf("kept no request or approval")
	}
	q, a := got.Network.Requests[0], got.Network.Approvals[0]
	sum := sha256.Sum256([]byte(many.Network.Requests[0].Path))
	if !strings.HasPrefix(q.Path, long[:400]) || !strings.HasSuffix(q.Path, hex.EncodeToString(sum[:])+"]") || len(q.Path) > maxPath+200 {
		t.Errorf("cut path %q; want a marked cut with the whole's SHA-256", q.Path)
	}
	if !strings.Contains(a.URL, "…[cut: ") {
		t.Errorf("cut URL %q; want a marked cut", a.URL)
	}
	if many.Network.Requests[0].Path != long+"/0" {
		t.Error("the caller's record was changed")
	}
}

// The log rotates at MaxBytes, into PATH.1, also when several Logs (as
// several agentrun processes) append at once: no line is split or lost
// but to the rotation, and the log never takes more than twice MaxBytes.
func TestLogRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const max = 8 << 10
	var logs []*Log
	for range 3 {
		l, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		l.MaxBytes = max
		logs = append(logs, l)
	}
	var wg sync.WaitGroup
	for i, l := range logs {
		wg.Go(func() {
			for j := range 300 {
				if err := l.Write(&Record{ID: fmt.Sprintf("ar-%d-%d", i, j), TaskHash: "sha256:x"}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, l := range logs {
		l.Close()
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 2 {
		t.Fatalf("%d files in the log dir; want audit.jsonl and audit.jsonl.1", len(ents))
	}
	for _, p := range []string{path, path + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > max || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %d bytes, mode %v; want at most %d, 0600", p, fi.Size(), fi.Mode().Perm(), max)
		}
		f, _ := os.Open(p)
		n := 0
		for sc := bufio.NewScanner(f); sc.Scan(); n++ {
			var r Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.TaskHash != "sha256:x" {
				t.Fatalf("%s line %d is not a whole record: %q", p, n, sc.Text())
			}
		}
		f.Close()
		if n == 0 {
			t.Errorf("%s is empty", p)
		}
	}
}

// A record of many approvals refused at once, too long for its line,
// keeps the decisions of a person at its end (approved, or a refusal its
// decider was told was taken) when its list is cut, and says how long the
// list was: a program cannot push them out with a flood of requests.
func TestRecordKeepsDecidedApprovals(t *testing.T) {
	long := strings.Repeat("p", 400)
	rec := &Record{ID: "ar-1"}
	for i := range 2000 {
		rec.Network.Approvals = append(rec.Network.Approvals, result.Approval{ID: fmt.Sprintf("ap-%d", i), Service: "api", Method: "POST",
			URL: "https://api.test/" + long, By: "too many requests waiting for approval"})
	}
	rec.Network.Approvals = append(rec.Network.Approvals,
		result.Approval{ID: "ap-yes", Service: "api", Method: "POST", URL: "https://api.test/send", Approved: true, By: "operator (alice)", Taken: true},
		result.Approval{ID: "ap-no", Service: "api", Method: "POST", URL: "https://api.test/drop", By: "operator (bob)", Taken: true})
	line, err := marshalBounded(rec)
	if err != nil || len(line) > MaxRecordBytes {
		t.Fatalf("%d bytes, %v", len(line), err)
	}
	var got Record
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	if got.Truncated == nil || got.Truncated.NetworkApprovals != 2002 {
		t.Errorf("truncated = %+v; want network_approvals 2002", got.Truncated)
	}
	var ids []string
	for _, a := range got.Network.Approvals {
		if a.By != "too many requests waiting for approval" {
			ids = append(ids, a.ID)
		}
	}
	if len(got.Network.Approvals) >= 2002 || !slices.Equal(ids, []string{"ap-yes", "ap-no"}) {
		t.Errorf("kept %d approvals, decided by a person %v; want the list cut, ap-yes and ap-no kept", len(got.Network.Approvals), ids)
	}
	if first := got.Network.Approvals[0].ID; first != "ap-0" {
		t.Errorf("first approval kept %s; want the list's order, ap-0 first", first)
	}
}

// A record of many tool calls, too long for its line, keeps the calls a
// person decided when its list is cut and counts the cut in
// truncated.tool_calls; a tool's name is cut to its bound.
func TestRecordKeepsDecidedToolCalls(t *testing.T) {
	rec := &Record{ID: "ar-1", Tools: &result.Tools{}}
	for i := range 3000 {
		rec.Tools.Calls = append(rec.Tools.Calls, result.ToolCall{Server: "ev", Tool: fmt.Sprintf("t%d-%s", i, strings.Repeat("n", 600)),
			Reason: "no rule of the config allows it", ArgumentsSHA256: strings.Repeat("0", 64)})
	}
	rec.Tools.Calls = append(rec.Tools.Calls,
		result.ToolCall{Server: "ev", Tool: "send", Allowed: true, Approval: "ap-yes", By: "operator (alice)"},
		result.ToolCall{Server: "ev", Tool: "drop", Approval: "ap-no", By: "operator (bob)", Reason: "denied"})
	line, err := marshalBounded(rec)
	if err != nil || len(line) > MaxRecordBytes {
		t.Fatalf("%d bytes, %v", len(line), err)
	}
	if len(rec.Tools.Calls) != 3002 {
		t.Errorf("marshalBounded changed the record's own calls: %d", len(rec.Tools.Calls))
	}
	var got Record
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	if got.Truncated == nil || got.Truncated.ToolCalls != 3002 || got.Tools == nil {
		t.Fatalf("truncated = %+v, tools %v; want tool_calls 3002", got.Truncated, got.Tools)
	}
	var decided []string
	for _, c := range got.Tools.Calls {
		if c.By != "" {
			decided = append(decided, c.Approval)
		}
		if c.By == "" && (len(c.Tool) > 400 || !strings.Contains(c.Tool, "…[cut: ")) {
			t.Errorf("a tool's name of %d bytes kept whole: %.40q", len(c.Tool), c.Tool)
		}
	}
	if len(got.Tools.Calls) >= 3002 || !slices.Equal(decided, []string{"ap-yes", "ap-no"}) {
		t.Errorf("kept %d calls, decided %v; want the list cut, ap-yes and ap-no kept", len(got.Tools.Calls), decided)
	}
}

// A process's command is escaped word by word (an ESC and a newline
// are shown as \x1b and \n, never written raw) and cut to its bound,
// saying how many words it had; a sandbox's record of 1000 processes of
// long commands is cut to its line, saying how many it listed.
func TestRecordProcessesBounded(t *testing.T) {
	cmd, words := CommandOf([]string{"printf", "\x1b[2J\nx"})
	if !slices.Equal(cmd, []string{"printf", `\x1b[2J\nx`}) || words != 0 {
		t.Errorf("CommandOf = %q, %d", cmd, words)
	}
	long := make([]string, 100)
	for i := range long {
		long[i] = strings.Repeat("w", 100)
	}
	cmd, words = CommandOf(long)
	if n := len(strings.Join(cmd, "")); n > maxCommand+200 || words != 100 || !strings.Contains(cmd[len(cmd)-1], "…[cut: ") {
		t.Errorf("a command of 100 long words: %d bytes in %d words, words %d, last %q", n, len(cmd), words, cmd[len(cmd)-1])
	}
	rec := &Record{ID: "sb-1", Kind: KindSandbox, ProcessesNotListed: 5}
	for i := range MaxProcesses {
		rec.Processes = append(rec.Processes, Process{Pid: i + 2, Command: cmd})
	}
	line, err := marshalBounded(rec)
	if err != nil || len(line) > MaxRecordBytes {
		t.Fatalf("%d bytes, %v", len(line), err)
	}
	var got Record
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	if got.Truncated == nil || got.Truncated.Processes != MaxProcesses || len(got.Processes) == 0 || got.ProcessesNotListed != 5 {
		t.Errorf("truncated %+v, %d listed, %d not listed", got.Truncated, len(got.Processes), got.ProcessesNotListed)
	}
	if len(rec.Processes) != MaxProcesses {
		t.Error("the caller's record was changed")
	}
}
