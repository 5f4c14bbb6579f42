package integration

import (
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
)

// TestServeSandboxTools: a live sandbox created with tools gets their
// broker at http://tools.agentrun for its life, as a run does: a process
// inside calls an allowed tool and gets its answer; a tool server of the
// config that the sandbox does not name is refused, so is a tool no rule
// allows; a call held for approval waits on serve's approvals (here the
// page's list and POST /v1/runs/RUN/approvals/ID) and, approved, gets
// its answer. The calls are counted in serve's metrics, and the
// sandbox's audit record lists every one, arguments only as their
// SHA-256. Nothing is left.
func TestServeSandboxTools(t *testing.T) {
	entry := everythingEntry(t)
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "sb.sock"),
		"approvals": map[string]any{"page": true}},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["audit"] = auditPath
	tools := everythingTools(t, entry, "")
	tools["other"] = tools["ev"] // in the config, not named by the sandbox
	cfg["tools"] = tools
	cfg["network"] = map[string]any{"approval_timeout": "60s"}
	s := startServeWith(t, cfg)

	resp, b := s.do("POST", "/v1/sandboxes", `{"image": "`+pythonImage+`", "tools": ["ev"]}`)
	var sb runapi.SandboxInfo
	if err := json.Unmarshal(b, &sb); resp.StatusCode != 201 || err != nil {
		t.Fatalf("a sandbox with tools: %d %s", resp.StatusCode, b)
	}
	py := func(calls ...string) string {
		code := toolPy
		for _, c := range calls {
			code += "print(" + c + ", flush=True)\n"
		}
		body, _ := json.Marshal(map[string]any{"command": []string{"python3", "-c", code}})
		return string(body)
	}
	out, exit := execOut(t, s, sb.ID, py(`call("get-sum", a=1, b=2)`, `call_on("other", "get-sum", a=1, b=2)`, `call("printEnv")`))
	want := "200 The sum of 1 and 2 is 3.\n404 unknown tool server other: the run's are [ev]\n403 tool printEnv of server ev: no rule of the config allows it\n"
	if *exit.ExitCode != 0 || out != want {
		t.Errorf("tool calls from inside: exit %d, %q; want %q", *exit.ExitCode, out, want)
	}

	// A held call, in the background, decided through serve's approvals.
	resp, b = s.do("POST", "/v1/sandboxes/"+sb.ID+"/processes?wait=false", py(`call("echo", message="held-9e1d")`))
	var bg struct{ Pid int }
	if err := json.Unmarshal(b, &bg); resp.StatusCode != 200 || err != nil {
		t.Fatalf("a held call in the background: %d %s", resp.StatusCode, b)
	}
	var list server.UIList
	for deadline := time.Now().Add(60 * time.Second); len(list.Held) < 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no call held; log: %s", s.log())
		}
		s.get("/ui/approvals.json", &list)
	}
	held := list.Held[0]
	if held.Kind != "tool" || held.Service != "ev" || held.Tool != "echo" || held.Arguments != `{"message":"held-9e1d"}` {
		t.Errorf("held %+v", held.Hold)
	}
	if code := s.approve(held.Run, held.ID, true); code != 200 {
		t.Errorf("approve: %d", code)
	}
	var got string
	for _, ev := range sandboxStream(t, s, "GET", "/v1/sandboxes/"+sb.ID+"/processes/"+strconv.Itoa(bg.Pid)+"/events", "", nil) {
		if ev.Event == "stdout" {
			got += ev.Data
		}
	}
	if got != "200 Echo: held-9e1d\n" {
		t.Errorf("the approved call answered %q", got)
	}

	_, m := s.do("GET", "/metrics", "")
	for _, want := range []string{`agentrun_tool_calls_total{outcome="answered",server="ev",tool="get-sum"} 1`,
		`agentrun_tool_calls_total{outcome="answered",server="ev",tool="echo"} 1`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if resp, b := s.do("DELETE", "/v1/sandboxes/"+sb.ID, ""); resp.StatusCode != 204 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
	}
	recs := sandboxRecords(t, auditPath)[sb.ID]
	if len(recs) != 1 || recs[0].Tools == nil {
		t.Fatalf("the sandbox's audit records: %+v", recs)
	}
	checkToolCalls(t, "the sandbox's audit record", recs[0].Tools.Calls[:1], []wantCall{
		{tool: "get-sum", allowed: true, arguments: `{"a":1,"b":2}`}})
	calls := recs[0].Tools.Calls
	if len(calls) != 4 || calls[1].Server != "other" || calls[1].Allowed || calls[2].Tool != "printEnv" || calls[2].Allowed ||
		calls[3].Tool != "echo" || !calls[3].Allowed || calls[3].Approval != held.ID || calls[3].By != "operator (serve API)" ||
		calls[3].ArgumentsSHA256 != argsSHA(`{"message":"held-9e1d"}`) {
		t.Errorf("the sandbox's audit record's tool calls: %+v", calls)
	}
	s.stop()
	assertNoLeaks(t)
}
