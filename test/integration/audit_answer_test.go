package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// readAudit is the audit log's records at path, by run id.
func readAudit(t *testing.T, path string) map[string]audit.Record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	recs := map[string]audit.Record{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var rec audit.Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		recs[rec.ID] = rec
	}
	return recs
}

// serviceReadPy reads the service "api" once and prints the answer.
const serviceReadPy = fetchPy + `
print(fetch("https://api.internet.test/api/read/x"))
`

// TestAuditRecordBeforeAnswer: a run with a service has its audit record
// on the log when its result reaches the door (hooks.Result, what serve
// answers from), before the sandbox's tear-down, with the service request
// the answer reports; the record is the run's one.
func TestAuditRecordBeforeAnswer(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		cfg, _ := serviceConfig(t, in, rt)
		auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
		log, err := audit.Open(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		r, err := compose.Runner(cfg, log)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := task.Load([]byte(pyTask(serviceReadPy, map[string]any{"network": map[string]any{"services": []string{"api"}}})), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var answered *result.Result
		var atAnswer map[string]audit.Record
		res := r.Run(context.Background(), plan, runapi.Hooks{Result: func(res *result.Result) {
			answered = res
			atAnswer = readAudit(t, auditPath)
		}})
		if res.Error != "" || res.Stdout != "200 api GET /api/read/x \n" {
			t.Fatalf("run: error %q, stdout %q, stderr %q", res.Error, res.Stdout, res.Stderr)
		}
		if answered == nil {
			t.Fatal("no result reached the hook")
		}
		rec, ok := atAnswer[answered.ID]
		if !ok || len(atAnswer) != 1 {
			t.Fatalf("audit log when the result reached the door: %d records, none of run %s; want its record written first", len(atAnswer), answered.ID)
		}
		if rec.ExitCode != 0 || len(rec.Network.Requests) != 1 || rec.Network.Requests[0].Service != "api" || !rec.Network.Requests[0].Allowed {
			t.Errorf("record at the answer: exit %d, requests %+v; want exit 0 and the service request", rec.ExitCode, rec.Network.Requests)
		}
		if after := readAudit(t, auditPath); len(after) != 1 {
			t.Errorf("%d records after the run; want its one", len(after))
		}
		assertNoLeaks(t)
	})
}

// TestServeAuditBeforeStreamResult: serve's stream of a run with a
// service sends its result event only once the run's audit record is on
// the log: read as soon as the event arrives, the log has it.
func TestServeAuditBeforeStreamResult(t *testing.T) {
	in := proxytest.NewInternet(t)
	cfg, _ := serviceServeConfig(t, in, "30s")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg["audit"] = auditPath
	s := startServeWith(t, cfg)
	body, _ := json.Marshal(map[string]any{"code": serviceReadPy, "network": map[string]any{"services": []string{"api"}}})
	for i := range 3 {
		resp, err := s.client.Post(s.base+"/v1/runs?stream=1", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		var res *result.Result
		var atResult map[string]audit.Record
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 16<<20)
		for res == nil && sc.Scan() {
			var ev server.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("stream line %q: %v", sc.Text(), err)
			}
			if ev.Event == "result" {
				atResult = readAudit(t, auditPath)
				res = ev.Result
			}
		}
		resp.Body.Close()
		if res == nil || res.Error != "" || res.Stdout != "200 api GET /api/read/x \n" {
			t.Fatalf("run %d: %+v (%v)", i, res, sc.Err())
		}
		if rec, ok := atResult[res.ID]; !ok || len(rec.Network.Requests) != 1 {
			t.Errorf("run %d: the audit log at the result event has %d records, run %s's %v (%+v); want its record with the service request", i, len(atResult), res.ID, ok, rec.Network.Requests)
		}
	}
	s.stop()
	assertNoLeaks(t)
}
