package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// These tests call npm's server-everything (test/mcp-servers) from the
// sandbox through the run's tool broker, as http://tools.agentrun and
// through agentrun_tools, beside tools_test.go's: every way the sandbox
// reaches it, what else it reaches, a held call's server process, the
// secret looked for everywhere, and a shared server's life.

// secretPrefix starts the secret a stdio tool server gets in its env. The
// sandbox looks for it everywhere it can read; its programs spell it as
// two strings, so that the task's own file never holds it.
const secretPrefix = "agentrun-secret-"

// rootSecret writes a fresh secret (secretPrefix, then random hex) into a
// root-only file and returns the file and the secret.
func rootSecret(t *testing.T) (path, secret string) {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	secret = secretPrefix + hex.EncodeToString(b)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(dir, "token")
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, secret
}

// everythingServer is server-everything over stdio (entry), with env,
// allowing the tools of allow and holding those of held for approval.
func everythingServer(t *testing.T, entry string, env map[string]config.ToolValue, allow, held []string) config.ToolServer {
	s := config.ToolServer{Command: []string{nodePath(t), entry, "stdio"}, Env: env,
		Rules: []config.ToolRule{{Tools: allow}}}
	if len(held) > 0 {
		s.Rules = append(s.Rules, config.ToolRule{Tools: held, Approve: true})
	}
	return s
}

// toolsRun runs taskJSON with cfg and hooks on a fresh runner whose
// audit log is at auditPath ("": none), and closes the runner.
func toolsRun(t *testing.T, cfg *config.Config, auditPath string, hooks runapi.Hooks, taskJSON string) *result.Result {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	plan, err := task.Load([]byte(taskJSON), cfg)
	if err != nil {
		t.Fatalf("task.Load: %v", err)
	}
	var log *audit.Log
	if auditPath != "" {
		if log, err = audit.Open(auditPath); err != nil {
			t.Fatal(err)
		}
		defer log.Close()
	}
	r, err := compose.Runner(cfg, log)
	if err != nil {
		t.Fatalf("compose.Runner: %v", err)
	}
	defer r.Close()
	res := r.Run(context.Background(), plan, hooks)
	if res.Error != "" {
		t.Fatalf("run failed: %s (stderr %q)", res.Error, res.Stderr)
	}
	return res
}

// toolsPyTask is a Python task of tool servers tools running code, with
// extra top-level fields.
func toolsPyTask(code string, tools []string, extra map[string]any) string {
	m := map[string]any{"code": code, "tools": tools, "limits": map[string]any{"timeout": "60s"}}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// serverProcs is serverProcesses of entry with each one's real uid.
func serverProcs(entry string) map[int]int {
	out := map[int]int{}
	for _, pid := range serverProcesses(entry) {
		if uid, ok := procUID(pid); ok {
			out[pid] = uid
		}
	}
	return out
}

// assertToolsClean fails the test if a process of entry or a tool
// server's cgroup under cfg's tools cgroup parent is left.
func assertToolsClean(t *testing.T, cfg *config.Config, entry string) {
	t.Helper()
	if procs := serverProcs(entry); len(procs) > 0 {
		t.Errorf("tool server processes left after the run: %v", procs)
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"} {
		entries, _ := os.ReadDir(filepath.Join(root, strings.TrimPrefix(cfg.ToolsCgroupParent(), "/")))
		for _, e := range entries {
			if e.IsDir() {
				t.Errorf("tool server cgroup left: %s", filepath.Join(root, cfg.ToolsCgroupParent(), e.Name()))
			}
		}
	}
	assertNoLeaks(t)
}

// sandboxProgram is the program of TestToolsFromSandbox: it calls tool
// server ev every way the sandbox can and prints what it saw as one JSON
// object.
const sandboxProgram = fetchPy + `
import json, os, urllib.request, urllib.error
import agentrun_tools
from agentrun_tools import ev, ToolError
out = {}
direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def post(opener, body):
    req = urllib.request.Request("http://tools.agentrun/v1/call", method="POST",
        data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        return json.load(opener.open(req, timeout=60))
    except urllib.error.HTTPError as e:
        return {"status": e.code, "error": json.load(e)["error"]}
listed = json.load(direct.open("http://tools.agentrun/v1/tools", timeout=60))["tools"]
out["raw_list"] = sorted(t["name"] for t in listed)
out["raw_call"] = post(direct, {"server": "ev", "tool": "echo", "arguments": {"message": "raw-direct"}})["content"][0]["text"]
out["proxied_call"] = post(urllib.request.build_opener(), {"server": "ev", "tool": "echo", "arguments": {"message": "raw-proxied"}})["content"][0]["text"]
out["raw_refused"] = post(direct, {"server": "ev", "tool": "get-env", "arguments": {}})
out["list"] = sorted("%s/%s" % (t["server"], t["name"]) for t in agentrun_tools.list())
out["call"] = agentrun_tools.call("ev", "echo", message="by-call")
out["sum"] = ev.get_sum(a=2, b=3)
out["structured"] = ev.get_structured_content(location="Chicago")
out["held"] = [c.get("type") for c in ev.get_tiny_image()]
out["dir_ev"] = dir(ev)
out["dir_module"] = "ev" in dir(agentrun_tools)
for name, fn in [("refused", lambda: ev.get_env()), ("is_error", lambda: ev.echo())]:
    try:
        out[name] = "no error: %r" % (fn(),)
    except ToolError as e:
        out[name] = str(e)
out["after"] = agentrun_tools.call("ev", "echo", message="went-on")
out["pythonpath"] = os.environ.get("PYTHONPATH")
out["module_file"] = agentrun_tools.__file__
try:
    open(agentrun_tools.__file__, "a")
    out["module_writable"] = True
except OSError:
    out["module_writable"] = False
# Nothing else is reachable.
out["internet_proxied"] = fetch("http://internet.test/")
out["internet_direct"] = fetch("http://internet.test/", proxies=False)
out["resolve_internet"] = resolve("internet.test")
out["resolve_tools"] = resolve("tools.agentrun")
out["gateway"] = os.environ.get("HTTP_PROXY", "").split("//")[-1].split(":")[0]
# The server's secret is nowhere the sandbox can read.
prefix = "agentrun-" + "secret-"
with open("/tmp/scan-control", "w") as f:  # the scan must find this one
    f.write(prefix + "control")
found = []
for k, v in os.environ.items():
    if prefix in v:
        found.append("env " + k)
for top in ["/proc"]:
    for pid in os.listdir(top):
        for f in ("environ", "cmdline"):
            try:
                if prefix.encode() in open(os.path.join(top, pid, f), "rb").read():
                    found.append(os.path.join(top, pid, f))
            except OSError:
                pass
for top in ["/etc", "/dev", "/run", "/tmp", "/workspace", "/home", "/root", "/var", "/opt", "/srv", "/mnt"]:
    for d, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < (1 << 20):
                    if prefix.encode() in open(p, "rb").read():
                        found.append(p)
            except OSError:
                pass
out["secret_found"] = found
print(json.dumps(out))
`

// TestToolsFromSandbox: on both runtimes, a run with tools and no
// network.allow calls server-everything, a stdio server holding a secret
// in its env: the program lists and calls its tools with urllib (direct
// and through the proxy variables) and through agentrun_tools (list,
// call, a server's attributes, dir, structured content, a content list);
// a tool no rule allows and a tool's isError raise ToolError with the
// broker's or the server's words and the program goes on. The held call's
// approver finds the server's process running as a uid of run_uids, not root. The
// module is read-only and first on PYTHONPATH; nothing but tools.agentrun
// is reachable; the secret is nowhere in the sandbox, the result or the
// audit record; the result and the record list every call; no process or
// cgroup of the server is left.
func TestToolsFromSandbox(t *testing.T) {
	entry := everythingEntry(t)
	secretFile, secret := rootSecret(t)
	in := proxytest.NewInternet(t)
	eachRuntime(t, func(t *testing.T, rt string) {
		cfg := netConfigFor(t, in, rt)
		auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
		cfg.Tools = config.Tools{"ev": everythingServer(t, entry,
			map[string]config.ToolValue{"API_TOKEN": {File: secretFile}, "MODE": {Value: "test"}},
			[]string{"echo", "get-sum", "get-structured-content"}, []string{"get-tiny-image"})}
		var mu sync.Mutex
		var seen map[int]int
		approve := func(ctx context.Context, run string, a approvals.Approval) approvals.Decision {
			mu.Lock()
			seen = serverProcs(entry)
			mu.Unlock()
			return approvals.Decision{Taken: true, Approved: a.Tool == "get-tiny-image", By: "test"}
		}
		res := toolsRun(t, cfg, auditPath, runapi.Hooks{Approve: approve},
			toolsPyTask(sandboxProgram, []string{"ev"}, map[string]any{"env": map[string]string{"PYTHONPATH": "/workspace/lib"}}))
		var out struct {
			RawList     []string `json:"raw_list"`
			List        []string `json:"list"`
			DirEv       []string `json:"dir_ev"`
			SecretFound []string `json:"secret_found"`
			Held        []string `json:"held"`
			RawCall     string   `json:"raw_call"`
			ProxiedCall string   `json:"proxied_call"`
			Call        string   `json:"call"`
			Refused     string   `json:"refused"`
			IsError     string   `json:"is_error"`
			After       string   `json:"after"`
			Pythonpath  string   `json:"pythonpath"`
			ModuleFile  string   `json:"module_file"`
			RawRefused  struct {
				Status int    `json:"status"`
				Error  string `json:"error"`
			} `json:"raw_refused"`
			Sum             string         `json:"sum"`
			Structured      map[string]any `json:"structured"`
			DirModule       bool           `json:"dir_module"`
			ModuleWritable  bool           `json:"module_writable"`
			InternetProxied string         `json:"internet_proxied"`
			InternetDirect  string         `json:"internet_direct"`
			ResolveInternet string         `json:"resolve_internet"`
			ResolveTools    string         `json:"resolve_tools"`
			Gateway         string         `json:"gateway"`
		}
		if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
			t.Fatalf("stdout %q (%v); stderr %q", res.Stdout, err, res.Stderr)
		}
		if res.ExitCode != 0 {
			t.Errorf("exit code %d; stderr %q", res.ExitCode, res.Stderr)
		}
		tools := []string{"echo", "get-structured-content", "get-sum", "get-tiny-image"}
		if strings.Join(out.RawList, ",") != strings.Join(tools, ",") {
			t.Errorf("GET /v1/tools: %q; want the allowed and held tools %q", out.RawList, tools)
		}
		if strings.Join(out.List, ",") != "ev/echo,ev/get-structured-content,ev/get-sum,ev/get-tiny-image" {
			t.Errorf("agentrun_tools.list(): %q", out.List)
		}
		if strings.Join(out.DirEv, ",") != "echo,get_structured_content,get_sum,get_tiny_image" || !out.DirModule {
			t.Errorf("dir(ev) %q, ev in dir(agentrun_tools) %v", out.DirEv, out.DirModule)
		}
		for got, want := range map[string]string{out.RawCall: "Echo: raw-direct", out.ProxiedCall: "Echo: raw-proxied",
			out.Call: "Echo: by-call", out.After: "Echo: went-on", out.Sum: "The sum of 2 and 3 is 5."} {
			if got != want {
				t.Errorf("a call answered %q; want %q", got, want)
			}
		}
		if _, ok := out.Structured["temperature"]; !ok {
			t.Errorf("get_structured_content: %v; want its structuredContent", out.Structured)
		}
		if len(out.Held) < 1 || !strings.Contains(strings.Join(out.Held, ","), "image") {
			t.Errorf("get_tiny_image (held, approved): content types %q; want a content list with an image", out.Held)
		}
		if out.RawRefused.Status != 403 || !strings.Contains(out.RawRefused.Error, "no rule of the config allows it") {
			t.Errorf("POST get-env: %+v; want 403 naming the rule", out.RawRefused)
		}
		// A tool the run's list does not have keeps its Python name.
		if !strings.Contains(out.Refused, "tool get_env of server ev: no rule of the config allows it") {
			t.Errorf("ev.get_env(): %q; want ToolError naming the rule", out.Refused)
		}
		if strings.HasPrefix(out.IsError, "no error") || !strings.Contains(strings.ToLower(out.IsError), "message") {
			t.Errorf("ev.echo() without its message: %q; want ToolError with the server's words", out.IsError)
		}
		if out.Pythonpath != "/dev/agentrun-python:/workspace/lib" || out.ModuleFile != "/dev/agentrun-python/agentrun_tools.py" || out.ModuleWritable {
			t.Errorf("PYTHONPATH %q, module %q, writable %v; want it first, read-only", out.Pythonpath, out.ModuleFile, out.ModuleWritable)
		}
		if !strings.HasPrefix(out.InternetProxied, "403") || strings.HasPrefix(out.InternetDirect, "200") ||
			out.ResolveInternet != "NXDOMAIN" || out.ResolveTools != out.Gateway || out.Gateway == "" {
			t.Errorf("network: internet.test proxied %q, direct %q, resolves %q; tools.agentrun resolves %q, gateway %q",
				out.InternetProxied, out.InternetDirect, out.ResolveInternet, out.ResolveTools, out.Gateway)
		}
		if strings.Join(out.SecretFound, ",") != "/tmp/scan-control" {
			t.Errorf("the sandbox's scan for the tool server's secret found %q; want only its own control file", out.SecretFound)
		}
		mu.Lock()
		if len(seen) == 0 {
			t.Errorf("no process of the tool server while a call was held")
		}
		for pid, uid := range seen {
			if !inRunUIDs(uid) {
				t.Errorf("tool server process %d runs as uid %d; want one of run_uids", pid, uid)
			}
		}
		mu.Unlock()

		whole, _ := json.Marshal(res)
		if strings.Contains(string(whole), secret) {
			t.Errorf("the result holds the tool server's secret")
		}
		if strings.Contains(string(whole), "tools.agentrun") {
			t.Errorf("the result records tools.agentrun as network traffic: %+v", res.Network)
		}
		want := []struct {
			tool    string
			allowed bool
			reason  string
		}{{"echo", true, ""}, {"echo", true, ""}, {"get-env", false, "no rule"}, {"echo", true, ""}, {"get-sum", true, ""},
			{"get-structured-content", true, ""}, {"get-tiny-image", true, ""}, {"get_env", false, "no rule"}, {"echo", true, ""}, {"echo", true, ""}}
		checkCalls := func(where string, calls []result.ToolCall) {
			if len(calls) != len(want) {
				t.Fatalf("%s: %d tool calls %+v; want %d", where, len(calls), calls, len(want))
			}
			for i, w := range want {
				c := calls[i]
				if c.Server != "ev" || c.Tool != w.tool || c.Allowed != w.allowed || !strings.Contains(c.Reason, w.reason) || (w.reason == "") != (c.Reason == "") {
					t.Errorf("%s: call %d = %+v; want %+v", where, i, c, w)
				}
			}
			if held := calls[6]; held.Approval == "" || held.By != "test" {
				t.Errorf("%s: the held call %+v; want its approval, by test", where, held)
			}
			if bad := calls[8]; !bad.IsError || !bad.Allowed {
				t.Errorf("%s: echo without its message %+v; want allowed, is_error", where, bad)
			}
		}
		checkCalls("result", toolCallsOf(t, res))
		checkCalls("audit record", auditToolCalls(t, auditPath, secret))
		assertToolsClean(t, cfg, entry)
	})
}

// TestToolsSharedServer: a stdio server marked shared is started at the
// first run's call and kept, the same process, for the runner's next run;
// the runner's Close stops it and leaves no process or cgroup of it.
func TestToolsSharedServer(t *testing.T) {
	entry := everythingEntry(t)
	cfg := cfgFor(t, "libcontainer")
	srv := everythingServer(t, entry, nil, []string{"echo"}, nil)
	srv.Shared = true
	cfg.Tools = config.Tools{"ev": srv}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		t.Fatalf("compose.Runner: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			r.Close()
		}
	}()
	var pids []map[int]int
	for i := range 2 {
		plan, err := task.Load([]byte(toolsPyTask(fmt.Sprintf("import agentrun_tools\nprint(agentrun_tools.call('ev', 'echo', message='run-%d'))", i), []string{"ev"}, nil)), cfg)
		if err != nil {
			t.Fatal(err)
		}
		res := r.Run(context.Background(), plan, runapi.Hooks{})
		if want := fmt.Sprintf("Echo: run-%d\n", i); res.Error != "" || res.Stdout != want {
			t.Fatalf("run %d: error %q, stdout %q; want %q (stderr %q)", i, res.Error, res.Stdout, want, res.Stderr)
		}
		pids = append(pids, serverProcs(entry))
	}
	if len(pids[0]) != 1 || !maps.Equal(pids[0], pids[1]) {
		t.Errorf("the shared server's processes after each run: %v, %v; want one, the same", pids[0], pids[1])
	}
	if err := r.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	closed = true
	assertToolsClean(t, cfg, entry)
}

// TestMCPLocalExitStopsSharedServer: an `agentrun mcp --local` whose
// client leaves stops the shared tool server its run started before it
// exits, and leaves no process or cgroup of it.
func TestMCPLocalExitStopsSharedServer(t *testing.T) {
	entry := everythingEntry(t)
	path := writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir, "store_dir": filepath.Join(stateDir, "store"),
		"tools": map[string]any{"ev": map[string]any{"command": []string{nodePath(t), entry, "stdio"}, "shared": true,
			"rules": []map[string]any{{"tools": []string{"echo"}}}}}})
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	m := startRawMCP(t, exec.Command(agentrunBin(t), "mcp", "--local", "--config", path))
	call, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "run_code",
		"arguments": map[string]any{"code": "import agentrun_tools\nprint(agentrun_tools.call('ev', 'echo', message='shared'))", "tools": []string{"ev"}}}})
	m.send(t, string(call))
	m.expect(t, `Echo: shared`)
	if len(serverProcs(entry)) != 1 {
		t.Fatalf("the shared server's processes after the run: %v; want one", serverProcs(entry))
	}
	m.in.Close()
	m.exits(t)
	if code := m.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("agentrun mcp exited %d; want 0", code)
	}
	assertToolsClean(t, cfg, entry)
}
