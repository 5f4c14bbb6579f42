package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/server"
)

// shellCall calls tool (exec_command or write_stdin) with args and
// returns its structured answer and text; an error answer fails the test.
func shellCall(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (mcpserver.ShellOutput, string) {
	t.Helper()
	res := callTool(t, cs, tool, args)
	text := answerText(t, res)
	if res.IsError {
		t.Fatalf("%s %v: error answer %q", tool, args, text)
	}
	var out mcpserver.ShellOutput
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil || res.StructuredContent == nil {
		t.Fatalf("%s: structuredContent %v: %v", tool, res.StructuredContent, err)
	}
	return out, text
}

// exited reports whether out is the answer of a process that ended with
// code.
func exited(out mcpserver.ShellOutput, code int) bool {
	return out.ExitCode != nil && *out.ExitCode == code && out.Process == 0
}

// TestMCPShell: exec_command and write_stdin (Codex's pair) in the MCP
// session's live sandbox: a command's output and exit code; a command
// still running past its yield time answered with its process, which
// write_stdin follows to its end; a cat fed and closed by write_stdin;
// files that persist from one call to the next; a working directory;
// output past an answer's bound cut and said so; an unknown process
// refused.
func TestMCPShell(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) }) // once the server has closed
	cs := inProcessMCP(t, testConfig(t), nil)
	for _, name := range []string{mcpserver.ExecTool, mcpserver.StdinTool} {
		if d := mcpTool(t, cs, name).Description; !strings.Contains(d, "yield_time_ms") || !strings.Contains(d, "empty chars") {
			t.Errorf("%s's description says nothing of the yield time or how to read a running process: %q", name, d)
		}
	}

	out, text := shellCall(t, cs, "exec_command", map[string]any{"cmd": "echo hi"})
	if out.Output != "hi\n" || !exited(out, 0) || !strings.Contains(text, "[exit code 0]") {
		t.Errorf("echo hi: %+v %q", out, text)
	}
	if out, _ := shellCall(t, cs, "exec_command", map[string]any{"cmd": "echo kept > f.txt; exit 3"}); !exited(out, 3) {
		t.Errorf("exit 3: %+v", out)
	}
	if out, _ := shellCall(t, cs, "exec_command", map[string]any{"cmd": "cat /workspace/f.txt; pwd"}); out.Output != "kept\n/workspace\n" || !exited(out, 0) {
		t.Errorf("the file of the last call: %+v", out)
	}
	if out, _ := shellCall(t, cs, "exec_command", map[string]any{"cmd": "pwd", "workdir": "/tmp"}); out.Output != "/tmp\n" {
		t.Errorf("workdir /tmp: %+v", out)
	}

	// Past its yield time: what it printed so far and its process.
	out, text = shellCall(t, cs, "exec_command", map[string]any{"cmd": "echo started; sleep 1; echo done", "yield_time_ms": 100})
	pid := out.Process
	if pid <= 0 || out.ExitCode != nil || !strings.Contains(text, "still running") {
		t.Fatalf("a command past its yield time: %+v %q", out, text)
	}
	first := out.Output
	out, _ = shellCall(t, cs, "write_stdin", map[string]any{"process": pid, "chars": "", "yield_time_ms": 30000})
	if first+out.Output != "started\ndone\n" || !exited(out, 0) {
		t.Errorf("write_stdin following process %d: %q then %+v", pid, first, out)
	}
	// Its exit was told: it is no longer one to write to.
	res := callTool(t, cs, "write_stdin", map[string]any{"process": pid, "chars": "x"})
	if text := answerText(t, res); !res.IsError || !strings.Contains(text, "no process") {
		t.Errorf("write_stdin to an ended process: %v %q", res.IsError, text)
	}
	res = callTool(t, cs, "write_stdin", map[string]any{"process": 99999})
	if text := answerText(t, res); !res.IsError || !strings.Contains(text, "no process 99999") {
		t.Errorf("write_stdin to no process: %v %q", res.IsError, text)
	}

	// cat, fed a line, then another and its end of input.
	out, _ = shellCall(t, cs, "exec_command", map[string]any{"cmd": "cat", "yield_time_ms": 0})
	if out.Process <= 0 {
		t.Fatalf("cat: %+v", out)
	}
	cat := out.Process
	a, _ := shellCall(t, cs, "write_stdin", map[string]any{"process": cat, "chars": "one\n", "yield_time_ms": 0})
	b, _ := shellCall(t, cs, "write_stdin", map[string]any{"process": cat, "chars": "two\n", "close_stdin": true, "yield_time_ms": 30000})
	if a.Process != cat || a.Output+b.Output != "one\ntwo\n" || !exited(b, 0) {
		t.Errorf("cat fed by write_stdin: %+v then %+v", a, b)
	}

	// Output past an answer's bound: its ends kept, the middle counted.
	out, text = shellCall(t, cs, "exec_command", map[string]any{"cmd": "head -c 200000 /dev/zero | tr '\\0' a; echo END", "yield_time_ms": 30000})
	if len(out.Output) > mcpserver.MaxShellOutput+16 || !strings.HasSuffix(out.Output, "aaaEND\n") ||
		out.CutBytes < 200004-mcpserver.MaxShellOutput || !strings.Contains(text, "output cut") || !exited(out, 0) {
		t.Errorf("200 kB of output: %d bytes kept, %d cut, ends %q; text ends %q", len(out.Output), out.CutBytes,
			out.Output[max(0, len(out.Output)-10):], text[max(0, len(text)-200):])
	}
}

// TestMCPShellEnds: the MCP session's live sandbox ends with the session:
// `agentrun mcp --local` whose client leaves, and serve's /mcp whose
// client ends its session (serve still running), leave nothing behind,
// though a process was still running in it.
func TestMCPShellEnds(t *testing.T) {
	live := func(cs *mcp.ClientSession) {
		t.Helper()
		if out, _ := shellCall(t, cs, "exec_command", map[string]any{"cmd": "sleep 600", "yield_time_ms": 0}); out.Process <= 0 {
			t.Fatalf("sleep 600: %+v", out)
		}
		if len(hostLeaks()) == 0 {
			t.Fatal("no sandbox on the host while the session's runs")
		}
	}

	cmd := exec.Command(agentrunBin(t), "mcp", "--local", "--config", mcpConfig(t, ""))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stderr = os.Stderr
	cs := mcpClient(t, &mcp.CommandTransport{Command: cmd})
	live(cs)
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	assertNoLeaks(t)

	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "sekrit"})
	c, err := server.NewClient("tcp://"+strings.TrimPrefix(s.base, "http://"), "sekrit")
	if err != nil {
		t.Fatal(err)
	}
	url, hc := c.HTTP("/mcp")
	cs = mcpClient(t, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1})
	live(cs)
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	assertNoLeaks(t)
	s.stop()
}
