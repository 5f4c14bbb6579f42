package toolbroker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/metrics"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/uidpool"
)

// allRules allow every tool of the test server but create_issue, held.
var allRules = []Rule{{Tools: []string{"create_issue"}, Approve: true}, {Tools: []string{"get_*", "echo", "big", "hang", "fork", "fail"}}}

// serverBinary is the test binary, where a server's user can run it: as
// root, a copy in a directory all may read (the server runs as a uid of
// the pool), outside /tmp and /run (a fenced server's are its own).
var serverBinary = sync.OnceValues(func() (string, error) {
	self, err := os.Executable()
	if err != nil || os.Geteuid() != 0 {
		return self, err
	}
	dir, err := os.MkdirTemp("/var/lib", "agentrun-toolbroker-test-")
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "server")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		return "", err
	}
	return bin, os.Chmod(dir, 0o755)
})

// testUIDs is the tests' pool of uids, as root: its reservations in a
// dir of their own, 64 ids above those of uidpool's default range and of
// testenv's scopes, picked by the process id.
var testUIDs = sync.OnceValues(func() (*uidpool.Range, error) {
	dir, err := os.MkdirTemp("/run", "toolbroker-uids-")
	if err != nil {
		return nil, err
	}
	testUIDsDir = dir
	first := int64(uidpool.DefaultFirst+uidpool.DefaultCount) + 1000*1024 + int64(os.Getpid()%1000)*64
	return uidpool.Open(filepath.Join(dir, "uids"), first, 64)
})

// testUIDsDir is the dir testUIDs made, which TestMain removes.
var testUIDsDir string

// fenceOpts sets, as root, the uid pool of opts and an owner of its own
// for its reservations, and checks at the end of the test that every one
// is given back.
func fenceOpts(t *testing.T, opts *Options) {
	t.Helper()
	if os.Geteuid() != 0 || opts.UIDs != nil {
		return
	}
	uids, err := testUIDs()
	if err != nil {
		t.Fatal(err)
	}
	opts.UIDs, opts.UIDOwner = uids, t.TempDir()
	t.Cleanup(func() {
		held, err := uids.Held()
		if err != nil {
			t.Error(err)
		}
		for id, owner := range held {
			if strings.HasPrefix(owner, opts.UIDOwner+"/") {
				t.Errorf("uid %d left reserved for %s", id, owner)
			}
		}
	})
}

// inPool reports whether uid is one of the tests' pool.
func inPool(t *testing.T, uid int) bool {
	t.Helper()
	uids, err := testUIDs()
	if err != nil {
		t.Fatal(err)
	}
	held, err := uids.Held()
	if err != nil {
		t.Fatal(err)
	}
	_, ok := held[uint32(uid)]
	return ok
}

// stdioServer is the test server over stdio, as the config's default user
// (nobody) when the test is root, with mode and env.
func stdioServer(t *testing.T, mode string, env ...EnvVar) Server {
	t.Helper()
	bin, err := serverBinary()
	if err != nil {
		t.Fatal(err)
	}
	s := Server{Name: "local", Command: []string{bin}, Env: append([]EnvVar{{Name: serverEnv, Value: mode}}, env...),
		UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Rules: allRules}
	if os.Geteuid() == 0 {
		s.UID, s.GID = config.NobodyID, config.NobodyID
	}
	return s
}

// serverPid is the pid of b's server name's process, in the host's pid
// namespace (the server sees itself as 1 when fenced); 0 when it runs
// none.
func serverPid(b *Broker, name string) int {
	c := b.servers[name].conn
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.cmd.Process.Pid
}

// childOf is a child of process pid, by the host's /proc; 0 when it has
// none.
func childOf(pid int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			n, _ := strconv.Atoi(e.Name())
			return n
		}
	}
	return 0
}

// testLimits are the default limits with a short call timeout.
func testLimits() Limits {
	l := LimitsFromConfig(config.Default().ToolLimits)
	l.CallTimeout = 5 * time.Second
	return l
}

func newBroker(t *testing.T, opts Options) *Broker {
	t.Helper()
	if opts.Limits == (Limits{}) {
		opts.Limits = testLimits()
	}
	opts.Run = "r-test"
	opts.Logf = t.Logf
	fenceOpts(t, &opts)
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// call POSTs a call to b and returns the status and the body.
func call(t *testing.T, b *Broker, server, tool, args string) (int, string) {
	t.Helper()
	body := `{"server": ` + string(must(json.Marshal(server))) + `, "tool": ` + string(must(json.Marshal(tool))) + `, "arguments": ` + args + `}`
	return do(t, b, httptest.NewRequest("POST", "http://tools.agentrun/v1/call", strings.NewReader(body)))
}

func do(t *testing.T, b *Broker, req *http.Request) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	b.Handler().ServeHTTP(w, req)
	return w.Code, w.Body.String()
}

// text is the text of a call's result's first content.
func text(t *testing.T, body string) string {
	t.Helper()
	var res struct {
		Content []struct{ Text string }
		IsError bool
	}
	if err := json.Unmarshal([]byte(body), &res); err != nil || len(res.Content) == 0 {
		t.Fatalf("result %s: %v", body, err)
	}
	return res.Content[0].Text
}

// secretFile is a root-only file holding value; the test skips without
// root (secret.Read wants root's files).
func secretFile(t *testing.T, value string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a secret file is root's: run as root")
	}
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestStdioListAndCall(t *testing.T) {
	m := metrics.New(metrics.Gauges{})
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, Count: m.ToolCalled})
	code, body := do(t, b, httptest.NewRequest("GET", "http://tools.agentrun/v1/tools", nil))
	var list struct {
		Tools []listedTool
	}
	if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil {
		t.Fatalf("GET /v1/tools = %d %s", code, body)
	}
	var names []string
	for _, tl := range list.Tools {
		names = append(names, tl.Name)
		if tl.Server != "local" || tl.InputSchema == nil {
			t.Errorf("tool %+v", tl)
		}
	}
	if got := strings.Join(names, ","); got != "big,create_issue,echo,fail,fork,get_env,get_ids,hang" {
		t.Errorf("tools listed: %s", got)
	}

	args := `{"b": [1, 2], "a": "<x>\n"}`
	code, body = call(t, b, "local", "echo", args)
	sent := `{"b":[1,2],"a":"\u003cx\u003e\n"}`
	if code != 200 || text(t, body) != sent || !strings.Contains(body, `"structuredContent":{"a":"\u003cx\u003e\n","b":[1,2]}`) {
		t.Fatalf("echo = %d %s", code, body)
	}
	code, body = call(t, b, "local", "get_ids", `{}`)
	ids := strings.Split(text(t, body), ":")
	uid, _ := strconv.Atoi(ids[0])
	if code != 200 || ids[0] == "0" || ids[1] != ids[0] && os.Geteuid() == 0 || os.Geteuid() == 0 && !inPool(t, uid) || os.Geteuid() != 0 && uid != os.Geteuid() {
		t.Errorf("get_ids = %d %s; want a uid of the pool as root, else agentrun's own", code, body)
	}
	code, body = call(t, b, "local", "fail", `{}`)
	if code != 200 || !strings.Contains(body, `"isError":true`) {
		t.Errorf("fail = %d %s", code, body)
	}
	code, body = call(t, b, "local", "nope\x1b", `{}`)
	if code != 403 || !strings.Contains(body, `tool nope\\x1b of server local: no rule of the config allows it`) {
		t.Errorf("refused tool = %d %s", code, body)
	}
	code, body = call(t, b, "other", "echo", `{}`)
	if code != 404 || !strings.Contains(body, "unknown tool server other") {
		t.Errorf("unknown server = %d %s", code, body)
	}
	for _, bad := range []string{`[1]`, `"x"`, `{"a":`} {
		if code, body := call(t, b, "local", "echo", bad); code != 400 {
			t.Errorf("arguments %s = %d %s", bad, code, body)
		}
	}

	rep := b.Report()
	if len(rep.Calls) != 8 {
		t.Fatalf("report: %+v", rep)
	}
	sum := sha256.Sum256([]byte(sent))
	if c := rep.Calls[0]; c.Server != "local" || c.Tool != "echo" || !c.Allowed || c.Reason != "" || c.ArgumentsSHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("record of echo: %+v", c)
	}
	if c := rep.Calls[2]; !c.IsError || !c.Allowed {
		t.Errorf("record of fail: %+v", c)
	}
	if c := rep.Calls[3]; c.Allowed || c.Tool != `nope\x1b` || !strings.Contains(c.Reason, "no rule") {
		t.Errorf("record of the refused tool: %+v", c)
	}
	var prom bytes.Buffer
	m.WritePrometheus(&prom)
	for _, want := range []string{`agentrun_tool_calls_total{outcome="answered",server="local",tool="echo"} 1`,
		`agentrun_tool_calls_total{outcome="refused",server="local",tool="-"} 3`, `agentrun_tool_calls_total{outcome="refused",server="-",tool="-"} 2`} {
		if !strings.Contains(prom.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, toolSeries(prom.String()))
		}
	}
}

func TestSecretEnv(t *testing.T) {
	const secret = "s3cr3t-value-1234"
	f := secretFile(t, secret)
	srv := stdioServer(t, "stdio", EnvVar{Name: "TOKEN", Prefix: "tok ", File: f})
	b := newBroker(t, Options{Servers: []Server{srv}})
	code, body := call(t, b, "local", "get_env", `{"name": "TOKEN"}`)
	if code != 200 || text(t, body) != "tok "+secret+"|2" {
		t.Errorf("get_env = %d %s; want the secret and 2 variables alone", code, body)
	}
	rep, _ := json.Marshal(b.Report())
	if strings.Contains(string(rep), secret) {
		t.Errorf("the report holds the secret: %s", rep)
	}

	// A server that fails at start: its error, and the log, hold no secret.
	var logs strings.Builder
	var mu sync.Mutex
	fail := stdioServer(t, "fail", EnvVar{Name: "SECRET", File: f})
	opts := Options{Run: "r-fail", Servers: []Server{fail}, Limits: testLimits(), Logf: func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs.WriteString(strings.ReplaceAll(strings.ReplaceAll(f, "%v", "%s"), "%s", "%v") + "\n")
		for _, v := range a {
			logs.WriteString(" " + strings.TrimSpace(strings.ReplaceAll(toString(v), "\n", " ")))
		}
	}}
	fenceOpts(t, &opts)
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	code, body = call(t, b2, "local", "echo", `{}`)
	mu.Lock()
	defer mu.Unlock()
	if code != 502 || !strings.Contains(body, "failed to start") || strings.Contains(body, secret) || strings.Contains(logs.String(), secret) {
		t.Errorf("a failed start = %d %s; log %s", code, body, logs.String())
	}
	if !strings.Contains(logs.String(), "[secret]") {
		t.Errorf("the log lacks the server's stderr, its secret replaced: %s", logs.String())
	}
}

func toString(v any) string {
	switch v := v.(type) {
	case error:
		return v.Error()
	case string:
		return v
	}
	return ""
}

func TestFailedStart(t *testing.T) {
	l := testLimits()
	l.CallTimeout = time.Second
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "fail"), func() Server {
		s := stdioServer(t, "mute")
		s.Name = "mute"
		return s
	}(), {Name: "gone", Command: []string{"/nonexistent/server"}, UID: 65534, GID: 65534, Rules: allRules}, func() Server {
		s := stdioServer(t, "stdio") // hosts to reach, and no Options.Network to reach them
		s.Name, s.Allow = "netless", []string{"example.com"}
		return s
	}()}, Limits: l})
	for _, server := range []string{"local", "mute", "gone", "netless"} {
		code, body := call(t, b, server, "echo", `{}`)
		if code != 502 || !strings.Contains(body, "tool server "+server+" failed to start") {
			t.Errorf("%s: %d %s", server, code, body)
		}
		start := time.Now()
		code2, body2 := call(t, b, server, "echo", `{}`)
		if code2 != code || body2 != body || time.Since(start) > 500*time.Millisecond {
			t.Errorf("%s: a second call = %d %s after %s; want the failure remembered", server, code2, body2, time.Since(start))
		}
	}
	if err := b.Start(context.Background()); err == nil {
		t.Error("Start of failed servers: no error")
	}
	if _, err := New(Options{Servers: []Server{{Name: "root", Command: []string{"/bin/true"}, Rules: allRules}}, Limits: testLimits()}); err == nil {
		t.Error("a server as root: no error")
	}
}

func TestApprove(t *testing.T) {
	var got []approvals.Approval
	var mu sync.Mutex
	answer := func(d approvals.Decision, wait bool) approvals.Func {
		return func(ctx context.Context, a approvals.Approval) approvals.Decision {
			mu.Lock()
			got = append(got, a)
			mu.Unlock()
			if wait {
				<-ctx.Done()
				return approvals.Decision{}
			}
			return d
		}
	}
	srv := stdioServer(t, "stdio")
	for _, tc := range []struct {
		name     string
		approve  approvals.Func
		args     string
		code     int
		want, by string
	}{
		{"yes", answer(approvals.Decision{Approved: true, By: "terminal"}, false), "{\"title\": \"a\u202eb\"}", 200, "created", "terminal"},
		{"no", answer(approvals.Decision{By: "operator (serve)"}, false), `{}`, 403, "denied by the operator (operator (serve))", "operator (serve)"},
		{"timeout", answer(approvals.Decision{}, true), `{}`, 403, "approval timed out after 1s", "timeout"},
		{"nobody", nil, `{}`, 403, "denied by the operator: no way to ask", "no way to ask"},
		{"too long", answer(approvals.Decision{Approved: true}, false), `{"a": "` + strings.Repeat("\\n", approvals.MaxArgumentsShown/2) + `"}`, 403, "arguments too long to show", ""},
	} {
		got = nil
		b := newBroker(t, Options{Servers: []Server{srv}, Approve: tc.approve, ApprovalTimeout: time.Second})
		code, body := call(t, b, "local", "create_issue", tc.args)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		c := b.Report().Calls[0]
		if c.Allowed != (code == 200) || c.By != tc.by || (tc.by != "") != (c.Approval != "") {
			t.Errorf("%s: record %+v", tc.name, c)
		}
		if tc.name == "yes" {
			if len(got) != 1 || got[0].Kind != approvals.KindTool || got[0].Service != "local" || got[0].Tool != "create_issue" ||
				got[0].Arguments != `{"title":"a\u202eb"}` || got[0].ID != c.Approval {
				t.Errorf("approval asked: %+v", got)
			}
		}
		if tc.name == "too long" && len(got) != 0 {
			t.Errorf("a call too long to show was asked about: %+v", got)
		}
	}

	// The program hanging up ends the wait.
	b := newBroker(t, Options{Servers: []Server{srv}, Approve: answer(approvals.Decision{}, true), ApprovalTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, "POST", "http://tools.agentrun/v1/call", strings.NewReader(`{"server": "local", "tool": "create_issue", "arguments": {}}`))
	start := time.Now()
	if code, body := do(t, b, req); code != 403 || !strings.Contains(body, "abandoned") || time.Since(start) > 10*time.Second {
		t.Errorf("hung up: %d %s after %s", code, body, time.Since(start))
	}
}

// TestDuplicateKeys: a call whose body holds an object with a key twice,
// at any depth (or twice but for letter case), is refused before anyone
// is asked and before the tool server gets it, the key's path named; a
// held call's arguments reach the approver with every character that is
// not visible on its own escaped.
func TestDuplicateKeys(t *testing.T) {
	var asked []approvals.Approval
	approve := func(_ context.Context, a approvals.Approval) approvals.Decision {
		asked = append(asked, a)
		return approvals.Decision{Approved: true, By: "terminal"}
	}
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, Approve: approve, ApprovalTimeout: 5 * time.Second})
	for _, c := range []struct{ tool, args, path string }{
		{"create_issue", `{"to": "alice@example.com", "body": "hi", "to": "mallory@example.com"}`, "/arguments/to"},
		{"echo", `{"to": "alice", "to": "mallory"}`, "/arguments/to"},
		{"echo", `{"msg": {"to": "alice", "cc": [{"x": 1, "x": 2}]}}`, "/arguments/msg/cc/0/x"},
		{"echo", `{"to": "alice", "t\u006f": "mallory"}`, "/arguments/to"},
		{"echo", `{"to": "alice", "TO": "mallory"}`, "/arguments/TO"},
	} {
		code, body := call(t, b, "local", c.tool, c.args)
		if code != 400 || !strings.Contains(body, "key "+c.path+" appears twice") {
			t.Errorf("%s %s = %d %s; want 400 naming %s", c.tool, c.args, code, body, c.path)
		}
	}
	// A key of the call's own, twice.
	body := `{"server": "local", "tool": "create_issue", "tool": "echo", "arguments": {}}`
	if code, got := do(t, b, httptest.NewRequest("POST", "http://tools.agentrun/v1/call", strings.NewReader(body))); code != 400 || !strings.Contains(got, "key /tool appears twice") {
		t.Errorf("tool twice = %d %s", code, got)
	}
	if len(asked) != 0 {
		t.Errorf("asked about a call with a key twice: %+v", asked)
	}
	for _, c := range b.Report().Calls {
		if c.Allowed || !strings.Contains(c.Reason, "appears twice") {
			t.Errorf("record %+v; want refused, saying why", c)
		}
	}

	// Hidden characters in a held call's arguments are shown escaped.
	code, got := call(t, b, "local", "create_issue", "{\"to\": \"alice\ufe0f\u3164\U000e0100\", \"title\": \"\u3164\u0301x\"}")
	want := `{"to":"alice\ufe0f\u3164\U000e0100","title":"\u3164\u0301x"}`
	if code != 200 || len(asked) != 1 || asked[0].Arguments != want {
		t.Errorf("hidden characters: %d %s, asked %+v; want arguments shown as %s", code, got, asked, want)
	}
}

func TestBounds(t *testing.T) {
	l := testLimits()
	l.Calls, l.Concurrent, l.ArgumentBytes, l.ResultBytes, l.CallTimeout = 1000, 1, 1024, 2048, time.Second
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, Limits: l})

	// 1: a call that hangs times out, and meanwhile 2: another is refused.
	done := make(chan string)
	go func() {
		code, body := call(t, b, "local", "hang", `{}`)
		done <- strconv.Itoa(code) + " " + body
	}()
	for deadline := time.Now().Add(10 * time.Second); len(b.sem) == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if code, body := call(t, b, "local", "echo", `{}`); code != 429 || !strings.Contains(body, "too many calls at once: 1 in flight") {
		t.Errorf("a call beside one in flight: %d %s", code, body)
	}
	if got := <-done; !strings.HasPrefix(got, "504 ") || !strings.Contains(got, "call timed out after 1s") {
		t.Errorf("hang: %s", got)
	}
	// 3: arguments too large, within the body's slack and past it.
	if code, body := call(t, b, "local", "echo", `{"a": "`+strings.Repeat("a", 1100)+`"}`); code != 413 || !strings.Contains(body, "arguments too large") {
		t.Errorf("large arguments: %d %s", code, body)
	}
	if code, body := call(t, b, "local", "echo", `{"a": "`+strings.Repeat("a", 10000)+`"}`); code != 413 {
		t.Errorf("larger arguments: %d %s", code, body)
	}
	// 4: a result past result_bytes; 5: one within it; 6: a frame past the
	// stdio bound (the connection is closed by it).
	if code, body := call(t, b, "local", "big", `{"n": 3000}`); code != 502 || !strings.Contains(body, "result too large: ") {
		t.Errorf("big result: %d %s", code, body)
	}
	if code, body := call(t, b, "local", "big", `{"n": 1000}`); code != 200 || len(text(t, body)) != 1000 {
		t.Errorf("a result within the bound: %d %.100s", code, body)
	}
	l.CallTimeout = 30 * time.Second // 5 MB made and sent, on a slow machine
	b2 := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, Limits: l})
	if code, body := call(t, b2, "local", "big", `{"n": 5000000}`); code != 502 || !strings.Contains(body, "result too large") {
		t.Errorf("a frame past the bound: %d %.200s", code, body)
	}
	for _, c := range b.Report().Calls {
		if !c.Allowed && c.Reason == "" || c.ArgumentsSHA256 == "" && c.Reason == "" {
			t.Errorf("record %+v", c)
		}
	}
}

func TestCallsPerRun(t *testing.T) {
	l := testLimits()
	l.Calls = 3
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, Limits: l})
	for i := range 3 {
		if code, body := call(t, b, "local", "echo", `{}`); code != 200 {
			t.Fatalf("call %d: %d %s", i, code, body)
		}
	}
	if code, body := call(t, b, "local", "echo", `{}`); code != 429 || !strings.Contains(body, "calls per run spent: 3 made") {
		t.Errorf("past calls: %d %s", code, body)
	}
}

func TestRecordsBounded(t *testing.T) {
	l := testLimits()
	l.Calls = MaxRecords + 10
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, Limits: l})
	for range MaxRecords + 5 {
		call(t, b, "local", "refused", `{}`)
	}
	if r := b.Report(); len(r.Calls) != MaxRecords || r.Dropped != 5 {
		t.Errorf("report: %d calls, %d dropped", len(r.Calls), r.Dropped)
	}
}

// gone waits, up to 10s, for pid to be no process (or a zombie reaped).
func gone(pid int) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && strings.Contains(string(b), ") Z ") {
			return true
		}
	}
	return false
}

func TestCloseStopsEverything(t *testing.T) {
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}})
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	server := serverPid(b, "local")
	_, body := call(t, b, "local", "fork", `{}`)
	child := childOf(server)
	t.Logf("fork: %s", body)
	if server == 0 || child == 0 || syscall.Kill(child, 0) != nil {
		t.Fatalf("server %d, child %d", server, child)
	}
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 15*time.Second {
		t.Errorf("Close took %s", time.Since(start))
	}
	if !gone(server) || !gone(child) {
		t.Errorf("after Close: server %d or its child %d left", server, child)
	}
	if code, body := call(t, b, "local", "echo", `{}`); code != 503 {
		t.Errorf("a call after Close: %d %s", code, body)
	}
}

func TestShared(t *testing.T) {
	sh := &Shared{Dir: t.TempDir()}
	defer sh.Close()
	srv := stdioServer(t, "stdio")
	srv.Shared = true
	pid := func(b *Broker) string {
		call(t, b, "local", "get_ids", `{}`)
		return strconv.Itoa(serverPid(b, "local"))
	}
	b1 := newBroker(t, Options{Servers: []Server{srv}, Shared: sh})
	p1 := pid(b1)
	b1.Close()
	b2 := newBroker(t, Options{Servers: []Server{srv}, Shared: sh})
	if p2 := pid(b2); p2 != p1 {
		t.Errorf("a shared server restarted between runs: %s, then %s", p1, p2)
	}
	b2.Close()
	if err := sh.Close(); err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p1)
	if !gone(n) {
		t.Errorf("shared server %d left after Shared.Close", n)
	}
	if os.Geteuid() == 0 {
		uids, _ := testUIDs()
		held, _ := uids.Held()
		for id, owner := range held {
			if strings.HasPrefix(owner, sh.Dir+"/") {
				t.Errorf("uid %d left reserved for %s after Shared.Close", id, owner)
			}
		}
		if left, _ := os.ReadDir(sh.Dir); len(left) > 0 {
			t.Errorf("the shared servers' lock left: %v", left)
		}
	}
}

// TestSharedReplacedOnConfigChange: a shared server whose config changed
// (a reload of serve) is started anew for the runs of the new config,
// in a cgroup of its own, while a run that holds the one before keeps
// it; the one before is stopped when the last run holding it ends.
func TestSharedReplacedOnConfigChange(t *testing.T) {
	sh := &Shared{Dir: t.TempDir()}
	defer sh.Close()
	before := stdioServer(t, "stdio")
	before.Shared = true
	after := stdioServer(t, "stdio", EnvVar{Name: "RELOADED", Value: "1"})
	after.Shared = true
	// The server's pid on the host (in its fence it is its namespace's
	// init), once a call has started it.
	pid := func(b *Broker) int {
		t.Helper()
		code, body := call(t, b, "local", "get_ids", `{}`)
		n := serverPid(b, "local")
		if code != 200 || n == 0 {
			t.Fatalf("get_ids: %d %s (pid %d)", code, body, n)
		}
		return n
	}
	b1 := newBroker(t, Options{Servers: []Server{before}, Shared: sh})
	p1 := pid(b1)
	b2 := newBroker(t, Options{Servers: []Server{after}, Shared: sh})
	p2 := pid(b2)
	if p2 == p1 {
		t.Fatalf("the changed config's run got the server of the config before (%d)", p1)
	}
	if p := pid(b1); p != p1 || syscall.Kill(p1, 0) != nil {
		t.Errorf("the run of the config before lost its server %d (now %d)", p1, p)
	}
	b1.Close()
	if !gone(p1) {
		t.Errorf("the replaced shared server %d is left once no run holds it", p1)
	}
	b3 := newBroker(t, Options{Servers: []Server{after}, Shared: sh})
	if p := pid(b3); p != p2 {
		t.Errorf("a run of the new config restarted its shared server: %d, then %d", p2, p)
	}
	b2.Close()
	b3.Close()
	if err := sh.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(p2) {
		t.Errorf("shared server %d left after Shared.Close", p2)
	}

	// Each connection has a cgroup of its own: stopping one kills every
	// process of its cgroup, never the other's.
	sh2 := &Shared{}
	c1, r1 := sh2.conn(before, startOpts{}, "/agentrun-tools", testLimits(), t.Logf)
	c2, r2 := sh2.conn(after, startOpts{}, "/agentrun-tools", testLimits(), t.Logf)
	if c1.start.cgPath == c2.start.cgPath {
		t.Errorf("two connections of server local share cgroup %s", c1.start.cgPath)
	}
	r1()
	r2()
	sh2.Close()
}

// httpServer serves the test server over streamable HTTP, answering 401
// to a request without the header auth.
func httpServer(t *testing.T, auth string) string {
	t.Helper()
	s := testServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if auth != "" && r.Header.Get("Authorization") != auth {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestHTTP(t *testing.T) {
	var headers []netpolicy.Inject
	auth := ""
	if os.Geteuid() == 0 {
		headers = []netpolicy.Inject{{Header: "Authorization", Prefix: "Bearer ", File: secretFile(t, "http-secret")}}
		auth = "Bearer http-secret"
	}
	l := testLimits()
	l.ResultBytes = 4096
	b := newBroker(t, Options{Servers: []Server{{Name: "remote", URL: httpServer(t, auth) + "/mcp", Headers: headers,
		Rules: []Rule{{Tools: []string{"echo", "big", "hang"}}}}}, Limits: l})
	code, body := do(t, b, httptest.NewRequest("GET", "http://tools.agentrun/v1/tools", nil))
	if code != 200 || strings.Count(body, `"server":"remote"`) != 3 {
		t.Errorf("list: %d %s", code, body)
	}
	if code, body := call(t, b, "remote", "echo", `{"x": 1}`); code != 200 || text(t, body) != `{"x":1}` {
		t.Errorf("echo: %d %s", code, body)
	}
	if code, body := call(t, b, "remote", "big", `{"n": 10000}`); code != 502 || !strings.Contains(body, "result too large") {
		t.Errorf("big: %d %.200s", code, body)
	}
	if code, body := call(t, b, "remote", "big", `{"n": 20000000}`); code != 502 || !strings.Contains(body, "result too large") {
		t.Errorf("a body past the bound: %d %.200s", code, body)
	}
	if code, body := call(t, b, "remote", "echo", `{}`); code != 200 {
		t.Errorf("after a refused result, echo: %d %s", code, body)
	}
	if strings.Contains(string(must(json.Marshal(b.Report()))), "http-secret") {
		t.Error("the report holds the header's secret")
	}

	// Without the header's file the server refuses; the call fails, the
	// run goes on.
	b2 := newBroker(t, Options{Servers: []Server{{Name: "remote", URL: httpServer(t, "Bearer x") + "/mcp", Rules: allRules}}})
	if code, body := call(t, b2, "remote", "echo", `{}`); code != 502 {
		t.Errorf("unauthorized: %d %s", code, body)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

var _ = io.EOF

func toolSeries(prom string) string {
	var out []string
	for _, l := range strings.Split(prom, "\n") {
		if strings.HasPrefix(l, "agentrun_tool_calls_total") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
