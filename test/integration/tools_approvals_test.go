package integration

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
)

// The held tool calls of these tests go to npm's server-everything
// (test/mcp-servers): its get-sum is allowed, its echo held for a human.

// everythingEntry is server-everything's entry point, in a copy of
// test/mcp-servers' packages that every user may read (the tool server
// runs unprivileged; the checkout's parents may not be readable).
func everythingEntry(t *testing.T) string {
	t.Helper()
	src := npmPackages(t, "mcp-servers", "@modelcontextprotocol/server-everything")
	dir := serversDir(t)
	if out, err := exec.Command("cp", "-a", filepath.Join(src, "node_modules"), dir).CombinedOutput(); err != nil {
		t.Fatalf("copying test/mcp-servers: %v %s", err, out)
	}
	if out, err := exec.Command("chmod", "-R", "a+rX", dir).CombinedOutput(); err != nil {
		t.Fatalf("chmod: %v %s", err, out)
	}
	return filepath.Join(dir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
}

// nodePath is node's absolute path (a stdio server's argv[0]).
func nodePath(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is missing (test/deps.sh installs nodejs and npm)")
	}
	node, err = filepath.Abs(node)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// everythingHTTP starts server-everything over streamable HTTP on a
// loopback port of its own until the test ends, and returns its URL.
func everythingHTTP(t *testing.T, entry string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(nodePath(t), entry, "streamableHttp")
	cmd.Env = []string{"PATH=/usr/bin:/bin", fmt.Sprintf("PORT=%d", port)} // it logs every request: its output is dropped
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server-everything did not listen on %s", addr)
		}
	}
	return "http://" + addr + "/mcp"
}

// everythingTools is the config's tools: server-everything as tool
// server ev, a stdio command of entry or, with url set, that URL; its
// get-sum allowed, its echo held for approval.
func everythingTools(t *testing.T, entry, url string) map[string]any {
	ev := map[string]any{"rules": []map[string]any{{"tools": []string{"get-sum"}}, {"tools": []string{"echo"}, "approve": true}}}
	if url != "" {
		ev["url"] = url
	} else {
		ev["command"] = []string{nodePath(t), entry, "stdio"}
	}
	return map[string]any{"ev": ev}
}

// toolPy defines call_on(server, tool, **arguments): a POST to the
// sandbox's http://tools.agentrun/v1/call, answered as "STATUS TEXT":
// the text of the tool's answer, or the broker's refusal; and
// call(tool, **arguments), of tool server ev.
const toolPy = `
import json, urllib.request, urllib.error
def call(tool, **arguments):
    return call_on("ev", tool, **arguments)
def call_on(server, tool, **arguments):
    req = urllib.request.Request("http://tools.agentrun/v1/call", method="POST",
        data=json.dumps({"server": server, "tool": tool, "arguments": arguments}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=90)
        return "%d %s" % (r.status, json.load(r)["content"][0]["text"])
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, json.load(e)["error"])
`

// toolTask is a task of tool server ev whose program prints the answer
// of each call of calls (Python expressions of call).
func toolTask(calls ...string) string {
	code := toolPy
	for _, c := range calls {
		code += "print(" + c + ", flush=True)\n"
	}
	b, _ := json.Marshal(map[string]any{"code": code, "tools": []string{"ev"}, "limits": map[string]any{"timeout": "60s"}})
	return string(b)
}

// argsSHA is the SHA-256 of arguments as the broker sends them, compact.
func argsSHA(arguments string) string {
	sum := sha256.Sum256([]byte(arguments))
	return hex.EncodeToString(sum[:])
}

// wantCall is what a test expects of one of a result's tools.calls[].
type wantCall struct {
	tool      string
	allowed   bool
	approval  string // the approval's id; "" for a call not held
	by        string
	arguments string // as sent, for its SHA-256
}

// checkToolCalls checks calls, a result's or audit record's tools.calls,
// against want.
func checkToolCalls(t *testing.T, where string, calls []result.ToolCall, want []wantCall) {
	t.Helper()
	if len(calls) != len(want) {
		t.Errorf("%s: %d tool calls %+v; want %d", where, len(calls), calls, len(want))
		return
	}
	for i, w := range want {
		c := calls[i]
		if c.Server != "ev" || c.Tool != w.tool || c.Allowed != w.allowed || c.Approval != w.approval || c.By != w.by ||
			c.ArgumentsSHA256 != argsSHA(w.arguments) || c.IsError {
			t.Errorf("%s: call %d = %+v; want %+v (arguments' SHA-256 %s)", where, i, c, w, argsSHA(w.arguments))
		}
	}
}

// auditToolCalls is the tools.calls of the audit log's one record at
// path; no line of it holds a word of secrets.
func auditToolCalls(t *testing.T, path string, secrets ...string) []result.ToolCall {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 1 {
		t.Fatalf("audit log: %d records; want 1:\n%s", len(lines), b)
	}
	for _, s := range secrets {
		if strings.Contains(lines[0], s) {
			t.Errorf("the audit record holds the call's arguments (%q): %s", s, lines[0])
		}
	}
	var rec struct {
		Tools *result.Tools `json:"tools"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec.Tools == nil {
		t.Fatalf("audit record without tools (%v): %s", err, lines[0])
	}
	return rec.Tools.Calls
}

// toolCallsOf is res's tools.calls.
func toolCallsOf(t *testing.T, res *result.Result) []result.ToolCall {
	t.Helper()
	if res.Tools == nil {
		t.Fatalf("result without tools: %+v", res)
	}
	return res.Tools.Calls
}

// TestToolApprovalsServeStream: a run's held tool calls to a real stdio
// MCP server come on serve's stream as approval events (kind tool, the
// tool server, the tool and its arguments), and POST
// /v1/runs/RUN/approvals/ID decides them: approved, the program gets the
// tool's answer; denied, a 403 saying who denied it; unanswered until
// network.approval_timeout, a 403 saying it timed out. A call no rule
// holds is not asked. The result's and the audit record's tools.calls
// say which was allowed, by which approval and by whom, and the audit
// record holds no argument.
func TestToolApprovalsServeStream(t *testing.T) {
	entry := everythingEntry(t)
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "s.sock")},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["audit"] = auditPath
	cfg["tools"] = everythingTools(t, entry, "")
	cfg["network"] = map[string]any{"approval_timeout": "4s"}
	s := startServeWith(t, cfg)

	task := toolTask(`call("get-sum", a=1, b=2)`, `call("echo", message="one-a1f3")`,
		`call("echo", message="two-b2e4")`, `call("echo", message="three-c3d5")`)
	var ids []string
	res := streamApprovals(t, s, task, func(ev server.Event) {
		a := ev.Approval
		n := len(ids)
		want := []string{`{"message":"one-a1f3"}`, `{"message":"two-b2e4"}`, `{"message":"three-c3d5"}`}
		if a == nil || n >= len(want) || a.Kind != "tool" || a.Service != "ev" || a.Tool != "echo" || a.Arguments != want[n] ||
			a.Method != "" || a.URL != "" || !strings.HasPrefix(ev.Run, "ar-") {
			t.Errorf("approval event %d = %+v (run %q)", n, a, ev.Run)
			return
		}
		ids = append(ids, a.ID)
		switch n {
		case 0:
			if code := s.approve(ev.Run, a.ID, true); code != 200 {
				t.Errorf("approve = %d", code)
			}
		case 1:
			if resp, _ := s.do("POST", fmt.Sprintf("/v1/runs/%s/approvals/%s", ev.Run, a.ID), `{"approve": false, "by": "alice"}`); resp.StatusCode != 200 {
				t.Errorf("deny = %d", resp.StatusCode)
			}
		}
	})
	want := "200 The sum of 1 and 2 is 3.\n200 Echo: one-a1f3\n403 denied by the operator (operator (serve API: alice))\n" +
		"403 approval timed out after 4s: denied\n"
	if res.Stdout != want || len(ids) != 3 {
		t.Fatalf("stdout %q; want %q (stderr %q); %d approvals asked, want 3", res.Stdout, want, res.Stderr, len(ids))
	}
	calls := []wantCall{
		{tool: "get-sum", allowed: true, arguments: `{"a":1,"b":2}`},
		{tool: "echo", allowed: true, approval: ids[0], by: "operator (serve API)", arguments: `{"message":"one-a1f3"}`},
		{tool: "echo", approval: ids[1], by: "operator (serve API: alice)", arguments: `{"message":"two-b2e4"}`},
		{tool: "echo", approval: ids[2], by: "timeout", arguments: `{"message":"three-c3d5"}`},
	}
	checkToolCalls(t, "result", toolCallsOf(t, res), calls)
	_, m := s.do("GET", "/metrics", "")
	for _, want := range []string{`agentrun_tool_calls_total{outcome="answered",server="ev",tool="get-sum"} 1`,
		`agentrun_tool_calls_total{outcome="answered",server="ev",tool="echo"} 1`,
		`agentrun_tool_calls_total{outcome="refused",server="ev",tool="echo"} 2`} {
		if !strings.Contains(string(m), want) {
			t.Errorf("/metrics lacks %s:\n%s", want, m)
		}
	}
	s.stop()
	checkToolCalls(t, "audit record", auditToolCalls(t, auditPath, "one-a1f3", "two-b2e4", "three-c3d5"), calls)
	assertNoLeaks(t)
}

// TestToolApprovalsWebhook: with server.approvals.webhook and a
// streamable-HTTP tool server, a plain POST's held tool calls are
// announced on the webhook, signed, as tool calls (kind, tool server,
// tool, arguments, no method or URL) with their run and expiry, and
// decided through POST /v1/runs/RUN/approvals/ID; the program sees each
// outcome, and the result and the audit record say who decided.
func TestToolApprovalsWebhook(t *testing.T) {
	url := everythingHTTP(t, everythingEntry(t))
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	hook, secret, holds := webhook(t)
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "s.sock"),
		"approvals": map[string]any{"webhook": hook, "webhook_secret_file": secret}},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["audit"] = auditPath
	cfg["tools"] = everythingTools(t, "", url)
	cfg["network"] = map[string]any{"approval_timeout": "30s"}
	s := startServeWith(t, cfg)

	out := postBackground(t, s, toolTask(`call("echo", message="hook-1")`, `call("echo", message="hook-2")`))
	var ids []string
	for i, msg := range []string{"hook-1", "hook-2"} {
		h := nextHold(t, holds)
		if h.Kind != "tool" || h.Service != "ev" || h.Tool != "echo" || h.Arguments != `{"message":"`+msg+`"}` ||
			h.Method != "" || h.URL != "" || !strings.HasPrefix(h.Run, "ar-") || h.ID == "" ||
			time.Until(h.ExpiresAt) < 10*time.Second || time.Until(h.ExpiresAt) > 31*time.Second {
			t.Errorf("hold %d = %+v", i, h)
		}
		ids = append(ids, h.ID)
		if i == 0 {
			if code := s.approve(h.Run, h.ID, true); code != 200 {
				t.Errorf("approve: %d", code)
			}
		} else if resp, _ := s.do("POST", fmt.Sprintf("/v1/runs/%s/approvals/%s", h.Run, h.ID), `{"approve": false, "by": "bob"}`); resp.StatusCode != 200 {
			t.Errorf("deny: %d", resp.StatusCode)
		}
	}
	res := <-out
	if want := "200 Echo: hook-1\n403 denied by the operator (operator (serve API: bob))\n"; res.Stdout != want {
		t.Fatalf("stdout %q; want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	calls := []wantCall{
		{tool: "echo", allowed: true, approval: ids[0], by: "operator (webhook)", arguments: `{"message":"hook-1"}`},
		{tool: "echo", approval: ids[1], by: "operator (serve API: bob)", arguments: `{"message":"hook-2"}`},
	}
	checkToolCalls(t, "result", toolCallsOf(t, res), calls)
	s.stop()
	checkToolCalls(t, "audit record", auditToolCalls(t, auditPath, "hook-1", "hook-2"), calls)
	assertNoLeaks(t)
}

// elicited is what test/mcp-client/elicit.mjs prints.
type elicited struct {
	Asked []string `json:"asked"`
	Tools struct {
		Items struct {
			Enum []string `json:"enum"`
		} `json:"items"`
	} `json:"tools"`
	Result struct {
		IsError           bool `json:"isError"`
		StructuredContent struct {
			Stdout string        `json:"stdout"`
			Stderr string        `json:"stderr"`
			Tools  *result.Tools `json:"tools"`
		} `json:"structuredContent"`
	} `json:"result"`
}

// elicit runs elicit.mjs of dir: the TypeScript SDK's client calls
// run_code with args on the `agentrun mcp` that mcpArgv starts,
// answering its elicitations with answers.
func elicit(t *testing.T, dir, answers string, mcpArgv []string, args map[string]any) elicited {
	t.Helper()
	b, _ := json.Marshal(args)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{filepath.Join(dir, "elicit.mjs"), answers, string(b)}, mcpArgv...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	var e elicited
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "{") {
			err = json.Unmarshal(sc.Bytes(), &e)
		}
	}
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(out)), "{") {
		t.Fatalf("node elicit.mjs %s: %v\n%s", answers, err, out)
	}
	return e
}

// elicitTwice has the TypeScript SDK's client, through mcpArgv, run a
// program that makes two held echo calls, accepting the first and
// refusing the second: run_code lists ev in its tools, each call is asked
// showing the tool server, the tool and its arguments, and the program
// sees each outcome. It returns the calls as the answer records them.
func elicitTwice(t *testing.T, dir string, mcpArgv []string) []wantCall {
	t.Helper()
	code := toolPy + "print(call('echo', message='echo-one'), flush=True)\nprint(call('echo', message='echo-two'), flush=True)\n"
	e := elicit(t, dir, "accept,reject", mcpArgv, map[string]any{"code": code, "tools": []string{"ev"}, "timeout": "60s"})
	if strings.Join(e.Tools.Items.Enum, ",") != "ev" {
		t.Errorf("run_code's tools lists %q; want ev", e.Tools.Items.Enum)
	}
	if len(e.Asked) != 2 {
		t.Fatalf("asked %d times %q; want 2 (stdout %q, stderr %q)", len(e.Asked), e.Asked, e.Result.StructuredContent.Stdout, e.Result.StructuredContent.Stderr)
	}
	for i, m := range e.Asked {
		for _, want := range []string{"tool server ev", "tool: echo", `arguments: {"message":"echo-` + []string{"one", "two"}[i] + `"}`, "Approve this tool call?"} {
			if !strings.Contains(m, want) {
				t.Errorf("elicitation %d %q lacks %q", i, m, want)
			}
		}
	}
	sc := e.Result.StructuredContent
	if want := "200 Echo: echo-one\n403 denied by the operator (mcp client (elicitation))\n"; e.Result.IsError || sc.Stdout != want {
		t.Fatalf("answer: error %v, stdout %q; want %q", e.Result.IsError, sc.Stdout, want)
	}
	if sc.Tools == nil || len(sc.Tools.Calls) != 2 {
		t.Fatalf("the answer's tools %+v; want 2 calls", sc.Tools)
	}
	ap1, ap2 := sc.Tools.Calls[0].Approval, sc.Tools.Calls[1].Approval
	if ap1 == "" || ap2 == "" || ap1 == ap2 {
		t.Errorf("approval ids %q %q; want two of their own", ap1, ap2)
	}
	calls := []wantCall{
		{tool: "echo", allowed: true, approval: ap1, by: "mcp client (elicitation)", arguments: `{"message":"echo-one"}`},
		{tool: "echo", approval: ap2, by: "mcp client (elicitation)", arguments: `{"message":"echo-two"}`},
	}
	checkToolCalls(t, "answer", sc.Tools.Calls, calls)
	return calls
}

// TestToolApprovalMCPElicitation: `agentrun mcp`, driven by the official
// TypeScript SDK's client (whose protocol predates multi round-trip
// requests), lists the config's tool servers in run_code's tools and
// asks its client, through MCP elicitation, to decide each held tool
// call of a run, showing the tool server, the tool and its arguments:
// the client's accept lets it through, its accept with approve false
// denies it; a client that offers no elicitation is not asked (denied:
// no way to ask). The same holds through an unprivileged `agentrun mcp`
// that forwards to serve. The answer's tools.calls and the audit record
// say who decided.
func TestToolApprovalMCPElicitation(t *testing.T) {
	entry := everythingEntry(t)
	dir := npmPackages(t, "mcp-client", "@modelcontextprotocol/sdk")
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	local := []string{agentrunBin(t), "mcp", "--local", "--config", writeConfig(t, map[string]any{"image": pythonImage,
		"state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"), "audit": auditPath,
		"tools": everythingTools(t, entry, ""), "network": map[string]any{"approval_timeout": "60s"}})}

	calls := elicitTwice(t, dir, local)
	checkToolCalls(t, "audit record", auditToolCalls(t, auditPath, "echo-one", "echo-two"), calls)

	// A client without elicitation: nobody to ask, denied.
	if err := os.Remove(auditPath); err != nil {
		t.Fatal(err)
	}
	e := elicit(t, dir, "none", local, map[string]any{"code": toolPy + "print(call('echo', message='echo-three'))", "tools": []string{"ev"}})
	sc := e.Result.StructuredContent
	if out := sc.Stdout; len(e.Asked) != 0 || !strings.HasPrefix(out, "403 denied by the operator") || !strings.Contains(out, "no way to ask") {
		t.Fatalf("a client without elicitation: asked %q, stdout %q; want 403 denied by the operator, no way to ask", e.Asked, out)
	}
	if sc.Tools == nil || len(sc.Tools.Calls) != 1 || sc.Tools.Calls[0].Approval == "" {
		t.Fatalf("the answer's tools without elicitation %+v; want 1 held call", sc.Tools)
	}
	calls = []wantCall{{tool: "echo", approval: sc.Tools.Calls[0].Approval, by: "no way to ask", arguments: `{"message":"echo-three"}`}}
	checkToolCalls(t, "answer without elicitation", sc.Tools.Calls, calls)
	checkToolCalls(t, "audit record without elicitation", auditToolCalls(t, auditPath, "echo-three"), calls)

	// Through an unprivileged agentrun mcp that forwards to serve.
	if err := os.Remove(auditPath); err != nil {
		t.Fatal(err)
	}
	cdir := clientDir(t)
	sock := filepath.Join(cdir, "agentrun.sock")
	cfg := serveConfig(map[string]any{"listen": "unix://" + sock}, map[string]any{"local_images": []string{*imagesDir}})
	cfg["audit"] = auditPath
	cfg["tools"] = everythingTools(t, entry, "")
	cfg["network"] = map[string]any{"approval_timeout": "60s"}
	s := startServeWith(t, cfg)
	if err := os.Chown(sock, 0, 65534); err != nil {
		t.Fatal(err)
	}
	calls = elicitTwice(t, dir, []string{"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
		"/usr/bin/env", "-i", "AGENTRUN_SERVER=unix://" + sock, copyBin(t, cdir), "mcp"})
	s.stop()
	checkToolCalls(t, "serve's audit record", auditToolCalls(t, auditPath, "echo-one", "echo-two"), calls)
	assertNoLeaks(t)
}

// rawCallPy defines raw(body): body POSTed as it is (UTF-8) to the
// sandbox's http://tools.agentrun/v1/call, answered as call's are.
const rawCallPy = `
def raw(body):
    req = urllib.request.Request("http://tools.agentrun/v1/call", method="POST",
        data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        r = urllib.request.urlopen(req, timeout=90)
        return "%d %s" % (r.status, json.load(r)["content"][0]["text"])
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, json.load(e)["error"])
`

// hiddenCallsPy makes three calls of tool server ev, printing each
// answer: get-sum with "a" twice (allowed without approval), echo with
// "message" twice (held), then echo held with a message that holds a
// variation selector, a Hangul filler and a supplementary variation
// selector, as raw UTF-8.
const hiddenCallsPy = toolPy + rawCallPy + `
print(raw('{"server": "ev", "tool": "get-sum", "arguments": {"a": 1, "a": 2, "b": 3}}'), flush=True)
print(raw('{"server": "ev", "tool": "echo", "arguments": {"message": "alice", "message": "mallory"}}'), flush=True)
print(raw(json.dumps({"server": "ev", "tool": "echo", "arguments": {"message": "hi\ufe0f\u3164\U000e0100"}}, ensure_ascii=False)), flush=True)
`

// hiddenShown is how a held call of hiddenCallsPy's third shows its
// arguments: the invisible characters escaped.
const hiddenShown = `{"message":"hi\ufe0f\u3164\U000e0100"}`

// hiddenRunes are hiddenCallsPy's invisible characters, none of which
// may reach a human raw.
var hiddenRunes = []string{"\ufe0f", "\u3164", "\U000e0100"}

// hiddenStdout is what hiddenCallsPy prints when its held call is
// approved: both calls with a key twice refused before anyone is asked
// (the get-sum one never reaches the server, which would have answered
// 200 with the sum of the last a and b).
const hiddenStdout = "400 the call is refused: key /arguments/a appears twice in its object\n" +
	"400 the call is refused: key /arguments/message appears twice in its object\n" +
	"200 Echo: hi\ufe0f\u3164\U000e0100\n"

// checkHiddenCalls checks calls, the tools.calls of hiddenCallsPy's run
// whose held call was approved (approval, by whom).
func checkHiddenCalls(t *testing.T, calls []result.ToolCall, approval, by string) {
	t.Helper()
	if len(calls) != 3 {
		t.Fatalf("tools.calls %+v; want 3", calls)
	}
	for i, c := range calls[:2] {
		if c.Allowed || c.Approval != "" || !strings.Contains(c.Reason, "appears twice") {
			t.Errorf("call %d with a key twice recorded as %+v; want refused, never held", i, c)
		}
	}
	checkToolCalls(t, "the held call", calls[2:], []wantCall{{tool: "echo", allowed: true, approval: approval, by: by,
		arguments: "{\"message\":\"hi\ufe0f\u3164\U000e0100\"}"}})
}

// TestToolApprovalHiddenAndDuplicateKeys: a held tool call whose
// arguments hold characters that are not visible on their own (U+FE0F,
// U+3164, U+E0100) shows them escaped on serve's stream, on the
// approvals page's /ui/approvals.json and in `agentrun mcp`'s
// elicitation; a call whose arguments hold a key twice is refused with
// 400 naming the key, before anyone is asked and before the tool server
// gets it.
func TestToolApprovalHiddenAndDuplicateKeys(t *testing.T) {
	entry := everythingEntry(t)
	cfg := serveConfig(map[string]any{"listen": "unix://" + filepath.Join(t.TempDir(), "s.sock"), "approvals": map[string]any{"page": true}},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["tools"] = everythingTools(t, entry, "")
	cfg["network"] = map[string]any{"approval_timeout": "60s"}
	s := startServeWith(t, cfg)
	task, _ := json.Marshal(map[string]any{"code": hiddenCallsPy, "tools": []string{"ev"}, "limits": map[string]any{"timeout": "60s"}})

	var ids []string
	res := streamApprovals(t, s, string(task), func(ev server.Event) {
		a := ev.Approval
		if a == nil {
			t.Fatalf("approval event without an approval: %+v", ev)
		}
		ids = append(ids, a.ID)
		if a.Kind != "tool" || a.Tool != "echo" || a.Arguments != hiddenShown {
			t.Errorf("approval event %+v; want echo's arguments shown as %s", a, hiddenShown)
		}
		resp, page := s.do("GET", "/ui/approvals.json", "")
		var list server.UIList
		if err := json.Unmarshal(page, &list); resp.StatusCode != 200 || err != nil || len(list.Held) != 1 || list.Held[0].Arguments != hiddenShown {
			t.Errorf("/ui/approvals.json = %d %s (%v); want the held call, its arguments shown as %s", resp.StatusCode, page, err, hiddenShown)
		}
		for _, r := range hiddenRunes {
			if strings.Contains(string(page), r) {
				t.Errorf("/ui/approvals.json holds %+q raw: %s", r, page)
			}
		}
		if code := s.approve(ev.Run, a.ID, true); code != 200 {
			t.Errorf("approve = %d", code)
		}
	})
	if res.Stdout != hiddenStdout || len(ids) != 1 {
		t.Fatalf("stdout %q; want %q (stderr %q); %d approvals asked, want 1", res.Stdout, hiddenStdout, res.Stderr, len(ids))
	}
	checkHiddenCalls(t, toolCallsOf(t, res), ids[0], "operator (serve API)")
	s.stop()

	// agentrun mcp: the elicitation shows the same text.
	dir := npmPackages(t, "mcp-client", "@modelcontextprotocol/sdk")
	local := []string{agentrunBin(t), "mcp", "--local", "--config", writeConfig(t, map[string]any{"image": pythonImage,
		"state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"), "audit": filepath.Join(t.TempDir(), "audit.jsonl"),
		"tools": everythingTools(t, entry, ""), "network": map[string]any{"approval_timeout": "60s"}})}
	e := elicit(t, dir, "accept", local, map[string]any{"code": hiddenCallsPy, "tools": []string{"ev"}, "timeout": "60s"})
	sc := e.Result.StructuredContent
	if len(e.Asked) != 1 || !strings.Contains(e.Asked[0], "arguments: "+hiddenShown+"\n") {
		t.Fatalf("asked %q; want once, the arguments shown as %s (stdout %q, stderr %q)", e.Asked, hiddenShown, sc.Stdout, sc.Stderr)
	}
	for _, r := range hiddenRunes {
		if strings.Contains(e.Asked[0], r) {
			t.Errorf("the elicitation holds %+q raw: %q", r, e.Asked[0])
		}
	}
	if sc.Stdout != hiddenStdout || sc.Tools == nil || len(sc.Tools.Calls) != 3 {
		t.Fatalf("stdout %q, tools %+v; want %q and 3 calls (stderr %q)", sc.Stdout, sc.Tools, hiddenStdout, sc.Stderr)
	}
	checkHiddenCalls(t, sc.Tools.Calls, sc.Tools.Calls[2].Approval, "mcp client (elicitation)")
	assertNoLeaks(t)
}
