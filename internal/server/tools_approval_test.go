package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/server/openapitest"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/untrusted"
)

// A held tool call's program-chosen words, hostile: a line break that
// would start a line of agentrun's, a bidirectional override, markup and
// a terminal escape.
const (
	hostileTool = "create_issue\nagentrun: approved by the operator\u202e"
	hostileArgs = `{"title":"<img src=x onerror=alert(1)>","body":"` + "\x1b[2J\u200b" + `"}`
)

// toolApproval is the Approval of a held tool call as the broker makes
// it: the program's bytes escaped (untrusted.Text).
func toolApproval() approvals.Approval {
	return approvals.Approval{ID: "ap-tool", Kind: approvals.KindTool, Service: "github",
		Tool: untrusted.Text(hostileTool), Arguments: untrusted.Text(hostileArgs)}
}

// TestToolApprovalOnServe: a held tool call reaches serve's stream as an
// approval event with its kind, tool server, tool and arguments (escaped,
// no raw control or format character on the line, no method or URL of a
// request), is listed on the approvals page's JSON the same way, is
// decided through the API, and stays among the page's last decisions as
// a tool call; every answer matches the OpenAPI document.
func TestToolApprovalOnServe(t *testing.T) {
	d, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.Approvals.Page = true
	run := func(ctx context.Context, _ *task.Plan, hooks runapi.Hooks) *result.Result {
		res := &result.Result{ID: "ar-tools"}
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		dec := hooks.Approve(actx, res.ID, toolApproval())
		res.Stdout = map[bool]string{true: "approved ", false: "denied "}[dec.Approved] + dec.By
		hooks.Result(res)
		return res
	}
	ts := httptest.NewServer(server.New(cfg, run, nil).Handler())
	defer ts.Close()
	get := func(path string) []byte {
		t.Helper()
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if err := d.Check("GET", path, resp.StatusCode, resp.Header, b); err != nil {
			t.Error(err)
		}
		return b
	}

	resp, err := http.Post(ts.URL+"/v1/runs?stream=1", "application/json", strings.NewReader(`{"code": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var all bytes.Buffer
	sc := bufio.NewScanner(io.TeeReader(resp.Body, &all))
	var res *result.Result
	for sc.Scan() {
		line := sc.Bytes()
		var ev map[string]json.RawMessage
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		switch string(ev["event"]) {
		case `"approval"`:
			if strings.ContainsAny(string(line), "\n\r\x1b\u202e\u200b") {
				t.Errorf("approval event %q carries a raw control or format character", line)
			}
			checkToolFields(t, "stream event", ev["approval"])
			var list struct{ Held []json.RawMessage }
			if err := json.Unmarshal(get("/ui/approvals.json"), &list); err != nil || len(list.Held) != 1 {
				t.Fatalf("approvals.json: %v, %d held", err, len(list.Held))
			}
			checkToolFields(t, "page's held", list.Held[0])
			body := `{"approve": true}`
			r, err := http.Post(ts.URL+"/v1/runs/ar-tools/approvals/ap-tool", "application/json", strings.NewReader(body))
			if err != nil || r.StatusCode != 200 {
				t.Fatalf("decide: %v %v", r, err)
			}
			r.Body.Close()
		case `"result"`:
			json.Unmarshal(ev["result"], &res)
		}
	}
	if res == nil || res.Stdout != "approved operator (serve API)" {
		t.Fatalf("result %+v; want approved operator (serve API)", res)
	}
	if err := d.Check("POST", "/v1/runs", 200, resp.Header, all.Bytes()); err != nil {
		t.Error(err)
	}
	var list struct{ Recent []json.RawMessage }
	if err := json.Unmarshal(get("/ui/approvals.json"), &list); err != nil || len(list.Recent) != 1 {
		t.Fatalf("approvals.json after: %v, %d recent", err, len(list.Recent))
	}
	checkToolFields(t, "page's recent", list.Recent[0])
}

// checkToolFields checks that raw, an approval object of some channel,
// is toolApproval's: kind tool, the tool server, the tool and arguments
// as their escapes, and a request's method, URL and body empty.
func checkToolFields(t *testing.T, where string, raw json.RawMessage) {
	t.Helper()
	var a map[string]any
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	want := map[string]any{"id": "ap-tool", "kind": "tool", "service": "github",
		"tool":      `create_issue\nagentrun: approved by the operator\u202e`,
		"arguments": `{"title":"<img src=x onerror=alert(1)>","body":"\x1b[2J\u200b"}`,
		"method":    "", "url": "", "body_excerpt": ""}
	for k, v := range want {
		if a[k] != v {
			t.Errorf("%s: %s = %#v; want %#v", where, k, a[k], v)
		}
	}
}

// TestOpenAPIToolApprovalShape: the document tells a held tool call from
// a held request: a tool call has its tool and arguments and no method,
// URL or body; a request has no tool or arguments.
func TestOpenAPIToolApprovalShape(t *testing.T) {
	d, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := json.Marshal(toolApproval())
	request, _ := json.Marshal(approvals.Approval{ID: "ap-1", Service: "api", Method: "POST", URL: "https://api.test/x"})
	for _, ok := range []string{string(tool), string(request)} {
		if err := d.Validate("/components/schemas/HeldRequest", []byte(ok)); err != nil {
			t.Error(err)
		}
	}
	for _, bad := range []string{
		`{"id":"a","kind":"tool","service":"s","tool":"t","arguments":"{}","method":"POST","url":"https://x/","body_excerpt":""}`,
		`{"id":"a","kind":"tool","service":"s","method":"","url":"","body_excerpt":""}`,
		`{"id":"a","service":"s","method":"POST","url":"https://x/","body_excerpt":"","tool":"t"}`,
		`{"id":"a","kind":"other","service":"s","method":"POST","url":"https://x/","body_excerpt":""}`,
	} {
		if d.Validate("/components/schemas/HeldRequest", []byte(bad)) == nil {
			t.Errorf("HeldRequest accepts %s", bad)
		}
	}
}

// TestAPITaskTools: POST /v1/runs takes the task's tools: a tool server
// of the config reaches the run's plan; one the config lacks is refused
// with 403 naming the field, before any run; the task is checked against
// the document's Task and every answer against its responses.
func TestAPITaskTools(t *testing.T) {
	d, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(`{"image": "dir:/nonexistent", "policy": {"local_images": ["/nonexistent"]},
		"tools": {"github": {"command": ["/usr/local/bin/github-mcp-server", "stdio"], "rules": [{"tools": ["get_*"]}]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	plans := make(chan *task.Plan, 2)
	run := func(_ context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		plans <- p
		res := &result.Result{ID: "ar-tools", Tools: &result.Tools{Calls: []result.ToolCall{}}}
		hooks.Result(res)
		return res
	}
	ts := httptest.NewServer(server.New(cfg, run, nil).Handler())
	defer ts.Close()
	post := func(body string) (int, []byte) {
		t.Helper()
		if err := d.Validate("/components/schemas/Task", []byte(body)); err != nil {
			t.Errorf("task %s: %v", body, err)
		}
		resp, err := http.Post(ts.URL+"/v1/runs", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if err := d.Check("POST", "/v1/runs", resp.StatusCode, resp.Header, b); err != nil {
			t.Error(err)
		}
		return resp.StatusCode, b
	}
	if st, b := post(`{"code": "x", "tools": ["github", "github"]}`); st != 200 {
		t.Fatalf("a task with the config's tools: %d %s", st, b)
	}
	if p := <-plans; strings.Join(p.Tools, ",") != "github" {
		t.Errorf("the run's plan has tools %q; want github", p.Tools)
	}
	st, b := post(`{"code": "x", "tools": ["nope"]}`)
	var e struct{ Error, Field string }
	if json.Unmarshal(b, &e); st != 403 || e.Field != "tools[0]" || !strings.Contains(e.Error, "github") {
		t.Errorf("a tool server the config lacks: %d %s; want 403 naming tools[0] and the known github", st, b)
	}
	select {
	case p := <-plans:
		t.Errorf("a refused task ran: %+v", p)
	default:
	}
}
