package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

func TestTaskID(t *testing.T) {
	if id, err := TaskID([]byte(`{"id":"job-1_a","code":"x"}`)); err != nil || id != "job-1_a" {
		t.Errorf("own id: %q %v", id, err)
	}
	a, err1 := TaskID([]byte(`{"code":"x"}`))
	b, err2 := TaskID([]byte(`{"code":"x"}`))
	if err1 != nil || err2 != nil || a == b || !strings.HasPrefix(a, "t-") {
		t.Errorf("generated ids %q %q: %v %v", a, b, err1, err2)
	}
	for _, bad := range []string{`{"id":"a.b"}`, `{"id":"a b"}`, `{"id":"` + strings.Repeat("x", 129) + `"}`, `{"id":"*"}`} {
		if _, err := TaskID([]byte(bad)); err == nil || !strings.Contains(err.Error(), "task: id:") {
			t.Errorf("%s: %v, want an error naming id", bad[:min(len(bad), 20)], err)
		}
	}
	if _, err := TaskID([]byte(`{"code":"x","nope":1}`)); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown field: %v", err)
	}
}

// TestTaskToolsTravel: a task's tools travel to the worker as they are:
// the submitter checks the syntax only (its own config need not declare
// the tool servers), and the worker judges them under its own config.
func TestTaskToolsTravel(t *testing.T) {
	data := []byte(`{"id":"job-tools","code":"x","tools":["github"]}`)
	if id, err := TaskID(data); err != nil || id != "job-tools" {
		t.Fatalf("TaskID of a task with tools: %q %v", id, err)
	}
	wcfg, err := config.Parse([]byte(`{"tools": {"github": {"url": "https://mcp.example.com/mcp", "rules": [{"tools": ["*"]}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := task.Load(data, wcfg)
	if err != nil || strings.Join(plan.Tools, ",") != "github" {
		t.Fatalf("the worker's plan: %+v %v; want tools github", plan, err)
	}
	if _, err := task.Load(data, config.Default()); err == nil || !strings.Contains(err.Error(), "tools[0]") {
		t.Errorf("a worker without the tool server: %v; want a refusal naming tools[0]", err)
	}
}

func TestEncodeFitsThePayload(t *testing.T) {
	small := &result.Result{Stdout: "45\n", StdoutBytes: 3}
	b, err := Encode(small, 1<<20)
	if err != nil || !strings.Contains(string(b), `"stdout":"45\n"`) {
		t.Errorf("small result: %s %v", b, err)
	}
	big := &result.Result{Stdout: strings.Repeat("a", 1<<20), StdoutBytes: 5 << 20, Stderr: "e", StderrBytes: 1,
		Files: map[string]result.File{"f": {Size: 3, ContentBase64: "AAAA"}}}
	b, err = Encode(big, 1<<20)
	if err != nil || len(b) > 1<<20-headroom {
		t.Fatalf("big result: %d bytes, %v", len(b), err)
	}
	var got result.Result
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Stdout != "" || got.Stderr != "" || len(got.Files) != 0 || !got.StdoutTruncated || !got.StderrTruncated ||
		got.StdoutBytes != 5<<20 || !strings.Contains(got.Error, "more than NATS carries") {
		t.Errorf("big result stored as %+v", got)
	}
	// The error set here makes it a failure in exit_code too, as in the
	// exit status of `agentrun submit`.
	if got.ExitCode != result.ExitSetup || got.ExitStatus() != result.ExitSetup {
		t.Errorf("big result: exit_code %d, exit status %d; want %d", got.ExitCode, got.ExitStatus(), result.ExitSetup)
	}
	big.Error = "cleaning up: x"
	if b, err = Encode(big, 1<<20); err != nil || json.Unmarshal(b, &got) != nil || !strings.Contains(got.Error, "more than NATS carries") || !strings.Contains(got.Error, "cleaning up: x") {
		t.Errorf("big result with an error: %v, stored as %+v", err, got)
	}
}
