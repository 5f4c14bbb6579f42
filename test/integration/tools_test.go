package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// toolSecret is the tool server's credential in these tests: it is in
// the server's environment, and never in the sandbox, the result or the
// audit record.
const toolSecret = "ev-secret-5f1c9a0b7d"

// toolsConfig is the suite's config with server-everything as tool server
// ev (a stdio command of entry, or url), its credential in its env from
// a root-only file, and rules: get-sum and echo allowed, get-env only
// when getEnv is set; an audit log at the path it returns.
func toolsConfig(t *testing.T, entry, url string, getEnv bool) (*config.Config, string) {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "ev-token")
	if err := os.WriteFile(secret, []byte(toolSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	allowed := []string{"get-sum", "echo"}
	if getEnv {
		allowed = append(allowed, "get-env")
	}
	ev := config.ToolServer{Rules: []config.ToolRule{{Tools: allowed}}}
	if url != "" {
		ev.URL = url
		ev.Headers = map[string]config.Inject{"X-Ev-Token": {File: secret}}
	} else {
		ev.Command = []string{nodePath(t), entry, "stdio"}
		ev.Env = map[string]config.ToolValue{"EV_TOKEN": {Prefix: "token ", File: secret}, "EV_PLAIN": {Value: "plain-value"}}
	}
	cfg := testConfig(t)
	cfg.Tools = config.Tools{"ev": ev}
	cfg.Audit = filepath.Join(t.TempDir(), "audit.jsonl")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg, cfg.Audit
}

// runTools runs taskJSON under cfg with hooks and an audit log, and
// returns its result and its audit record's line.
func runTools(t *testing.T, cfg *config.Config, hooks runapi.Hooks, taskJSON string) (*result.Result, string) {
	t.Helper()
	log, err := audit.Open(cfg.Audit)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	plan, err := task.Load([]byte(taskJSON), cfg)
	if err != nil {
		t.Fatalf("task.Load: %v", err)
	}
	r, err := compose.Runner(cfg, log)
	if err != nil {
		t.Fatalf("compose.Runner: %v", err)
	}
	res := r.Run(context.Background(), plan, hooks)
	if res.Error != "" {
		t.Fatalf("run failed: %s (stderr %q)", res.Error, res.Stderr)
	}
	b, err := os.ReadFile(cfg.Audit)
	if err != nil {
		t.Fatal(err)
	}
	return res, strings.TrimSpace(string(b))
}

// toolsProgram lists the run's tools over plain HTTP, calls them through
// agentrun_tools (a refused one in between: the run goes on), looks for
// the server's credential in its own environment and files, and tries
// the internet, which a run with tools and no allowlist does not reach.
const toolsProgram = `
import json, os, urllib.request, urllib.error
listed = json.load(urllib.request.urlopen("http://tools.agentrun/v1/tools", timeout=60))
print("listed", sorted(t["server"] + "/" + t["name"] for t in listed["tools"]))
import agentrun_tools
from agentrun_tools import ev
print("sum", ev.get_sum(a=2, b=40))
print("echo", agentrun_tools.call("ev", "echo", message="hello"))
try:
    agentrun_tools.call("ev", "get-env")
except agentrun_tools.ToolError as e:
    print("refused", e)
print("dir", [n for n in dir(ev)])
mark = "ev-" + "secret"
found = [k for k, v in os.environ.items() if mark in v]
for root, dirs, files in os.walk("/", onerror=lambda e: None):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for f in files:
        try:
            with open(os.path.join(root, f), "rb") as fh:
                if mark.encode() in fh.read(1 << 20):
                    found.append(os.path.join(root, f))
        except OSError:
            pass
print("secret", found)
try:
    urllib.request.urlopen("http://internet.test/", timeout=10)
    print("internet reached")
except Exception as e:
    print("internet refused")
`

// TestToolsFromCode: a run that names tool server ev (a real third-party
// MCP server over stdio, npm's server-everything) lists and calls its
// allowed tools from the sandbox, over HTTP and through agentrun_tools,
// gets a refused tool as an error naming the rule and goes on, never sees
// the server's credential, reaches nothing else; the result and the audit
// record list each call (the credential and the arguments in neither),
// and the server is gone afterwards, on both runtimes.
func TestToolsFromCode(t *testing.T) {
	entry := everythingEntry(t)
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			cfg, _ := toolsConfig(t, entry, "", false)
			// The walk of the whole root reads every file: at half a CPU
			// under runsc on a loaded host it outlasts the default 5 s.
			res, line := runTools(t, cfg, runapi.Hooks{}, pyTask(toolsProgram, map[string]any{"tools": []string{"ev"}, "runtime": rt,
				"limits": map[string]any{"timeout": "60s"}}))
			for _, want := range []string{
				"listed ['ev/echo', 'ev/get-sum']\n",
				"sum The sum of 2 and 40 is 42.\n",
				"echo Echo: hello\n",
				"refused tool get-env of server ev: no rule of the config allows it\n",
				"dir ['echo', 'get_sum']\n",
				"secret []\n",
				"internet refused\n",
			} {
				if !strings.Contains(res.Stdout, want) {
					t.Errorf("stdout lacks %q (exit %d, timed out %v):\n%s\nstderr: %s", want, res.ExitCode, res.TimedOut, res.Stdout, res.Stderr)
				}
			}
			calls := toolCallsOf(t, res)
			want := []struct {
				tool    string
				allowed bool
			}{{"get-sum", true}, {"echo", true}, {"get-env", false}}
			if len(calls) != len(want) {
				t.Fatalf("tools.calls = %+v; want %d", calls, len(want))
			}
			for i, w := range want {
				if c := calls[i]; c.Server != "ev" || c.Tool != w.tool || c.Allowed != w.allowed || c.IsError || len(c.ArgumentsSHA256) != 64 {
					t.Errorf("call %d = %+v; want %s allowed=%v", i, c, w.tool, w.allowed)
				}
			}
			if calls[1].ArgumentsSHA256 != argsSHA(`{"message":"hello"}`) {
				t.Errorf("echo's arguments_sha256 %s; want that of the arguments as sent", calls[1].ArgumentsSHA256)
			}
			b, _ := json.Marshal(res)
			if strings.Contains(string(b), toolSecret) {
				t.Errorf("the result holds the credential: %s", b)
			}
			if strings.Contains(line, toolSecret) || strings.Contains(line, "hello") {
				t.Errorf("the audit record holds the credential or the arguments: %s", line)
			}
			if !strings.Contains(line, `"tools":{"calls":[`) {
				t.Errorf("the audit record lists no tool calls: %s", line)
			}
			if pids := serverProcesses(entry); len(pids) > 0 {
				t.Errorf("tool server processes left after the run: %v", pids)
			}
			assertNoLeaks(t)
		})
	}
}

// serverProcesses are the pids of processes whose command line holds
// entry (the tool server's).
func serverProcesses(entry string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), entry) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// procUID is the real uid of process pid.
func procUID(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			uid, err := strconv.Atoi(f[1])
			return uid, err == nil
		}
	}
	return 0, false
}

// TestToolServerEnvironmentAndUser: the stdio server gets the environment
// the config gives and nothing else (its credential read from the
// root-only file, with its prefix), runs as a uid of run_uids, not root, while the
// run goes on, and is gone when it ends.
func TestToolServerEnvironmentAndUser(t *testing.T) {
	entry := everythingEntry(t)
	cfg, _ := toolsConfig(t, entry, "", true)
	cfg.Tools["ev"] = withRules(cfg.Tools["ev"], config.ToolRule{Tools: []string{"get-env", "get-sum"}}, config.ToolRule{Tools: []string{"echo"}, Approve: true})
	var uids []int
	hooks := runapi.Hooks{Approve: func(ctx context.Context, run string, a approvals.Approval) approvals.Decision {
		// The call is held: the server runs now.
		for _, pid := range serverProcesses(entry) {
			if uid, ok := procUID(pid); ok {
				uids = append(uids, uid)
			}
		}
		return approvals.Decision{Approved: true, By: "test"}
	}}
	code := `
import json
from agentrun_tools import ev
env = json.loads(ev.get_env())
print("env", sorted(env.items()))
print("echo", ev.echo(message="held"))
`
	res, _ := runTools(t, cfg, hooks, pyTask(code, map[string]any{"tools": []string{"ev"}}))
	if want := "env [('EV_PLAIN', 'plain-value'), ('EV_TOKEN', 'token " + toolSecret + "')]\n"; !strings.Contains(res.Stdout, want) {
		t.Errorf("the server's environment: stdout %q; want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
	if !strings.Contains(res.Stdout, "echo Echo: held\n") {
		t.Errorf("the approved call: stdout %q", res.Stdout)
	}
	if len(uids) == 0 {
		t.Fatal("no tool server process while a call was held")
	}
	for _, uid := range uids {
		if !inRunUIDs(uid) {
			t.Errorf("tool server uid %d; want one of run_uids", uid)
		}
	}
	if pids := serverProcesses(entry); len(pids) > 0 {
		t.Errorf("tool server processes left after the run: %v", pids)
	}
	assertNoLeaks(t)
}

// withRules is s with rules instead of its own.
func withRules(s config.ToolServer, rules ...config.ToolRule) config.ToolServer {
	s.Rules = rules
	return s
}

// TestToolBounds: past tool_limits.calls and argument_bytes a call gets an
// error naming the bound, and the run goes on to its end.
func TestToolBounds(t *testing.T) {
	entry := everythingEntry(t)
	cfg, _ := toolsConfig(t, entry, "", false)
	cfg.ToolLimits = config.ToolLimits{Calls: 3, ArgumentBytes: config.MustSize("1k")}
	code := `
import agentrun_tools
from agentrun_tools import ev
try:
    ev.echo(message="x" * 4000)
except agentrun_tools.ToolError as e:
    print("big", e)
for i in range(4):
    try:
        print("call", ev.get_sum(a=i, b=1))
    except agentrun_tools.ToolError as e:
        print("call", e)
print("end")
`
	res, _ := runTools(t, cfg, runapi.Hooks{}, pyTask(code, map[string]any{"tools": []string{"ev"}}))
	for _, want := range []string{"big arguments too large", "(tool_limits.argument_bytes)",
		"call The sum of 0 and 1 is 1.\n", "call The sum of 2 and 1 is 3.\n",
		"call calls per run spent: 3 made (tool_limits.calls)\n", "end\n"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("stdout lacks %q:\n%s\nstderr %s", want, res.Stdout, res.Stderr)
		}
	}
	if res.ExitCode != 0 {
		t.Errorf("exit code %d; the run goes on past a bound", res.ExitCode)
	}
	assertNoLeaks(t)
}

// TestToolsOverHTTP: a streamable-HTTP tool server is listed and called
// the same way, its header's credential sent to it and never shown to the
// sandbox.
func TestToolsOverHTTP(t *testing.T) {
	entry := everythingEntry(t)
	url := everythingHTTP(t, entry)
	cfg, _ := toolsConfig(t, entry, url, false)
	code := `
from agentrun_tools import ev
print("sum", ev.get_sum(a=1, b=2))
import os
print("secret", [k for k, v in os.environ.items() if "ev-" + "secret" in v])
`
	res, line := runTools(t, cfg, runapi.Hooks{}, pyTask(code, map[string]any{"tools": []string{"ev"}}))
	if !strings.Contains(res.Stdout, "sum The sum of 1 and 2 is 3.\n") || !strings.Contains(res.Stdout, "secret []\n") {
		t.Errorf("stdout %q (stderr %q)", res.Stdout, res.Stderr)
	}
	if calls := toolCallsOf(t, res); len(calls) != 1 || !calls[0].Allowed || calls[0].Tool != "get-sum" {
		t.Errorf("tools.calls %+v", calls)
	}
	if strings.Contains(line, "ev-secret") {
		t.Errorf("the audit record holds the credential: %s", line)
	}
	assertNoLeaks(t)
}
