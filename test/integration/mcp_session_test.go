package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/session"
)

// mcpAllTools are the tools of the MCP server as serve mounts it.
const mcpAllTools = "exec_command,fork_session,list_files,new_session,read_file,run_code,write_file,write_stdin"

// mcpTools lists the server's tools.
func mcpTools(t *testing.T, cs *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	return res.Tools
}

// mcpToolNames is the names of the server's tools, sorted, comma-separated.
func mcpToolNames(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	var names []string
	for _, tool := range mcpTools(t, cs) {
		names = append(names, tool.Name)
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// mcpTool is the server's tool name.
func mcpTool(t *testing.T, cs *mcp.ClientSession, name string) *mcp.Tool {
	t.Helper()
	for _, tool := range mcpTools(t, cs) {
		if tool.Name == name {
			return tool
		}
	}
	t.Fatalf("no tool %s; tools: %s", name, mcpToolNames(t, cs))
	return nil
}

// newMCPSession calls new_session and returns the id.
func newMCPSession(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	res := callTool(t, cs, "new_session", map[string]any{})
	var out struct{ Session string }
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); res.IsError || err != nil || !session.ValidID(out.Session) ||
		!strings.Contains(answerText(t, res), out.Session) {
		t.Fatalf("new_session: %v %q %s", res.IsError, answerText(t, res), b)
	}
	return out.Session
}

// removeNewSessions removes, when the test ends, the kept sessions it made
// through MCP (whose ids the tests do not always see), so that they count
// against no later test's sessions.max.
func removeNewSessions(t *testing.T) {
	t.Helper()
	st, err := session.Open(testConfig(t), 65534, 65534)
	if err != nil {
		t.Fatal(err)
	}
	ids := func() map[string]bool {
		all, err := st.All()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, in := range all {
			m[in.ID] = true
		}
		return m
	}
	before := ids()
	t.Cleanup(func() {
		for id := range ids() {
			if !before[id] {
				if err := st.Remove(id); err != nil {
					t.Errorf("removing session %s: %v", id, err)
				}
			}
		}
	})
}

// TestMCPSessions: new_session makes a kept session; a file written with
// write_file is read by run_code in that session, whose files read_file
// returns (text, or a blob when not UTF-8) and list_files lists; runs in
// it are counted under its id. Unknown sessions, busy ones, bad paths and
// files over the cap are refused with clear error answers, and the tools
// are listed with their schemas.
func TestMCPSessions(t *testing.T) {
	removeNewSessions(t)
	cfg := testConfig(t)
	cs := inProcessMCP(t, cfg, nil)

	if got := mcpToolNames(t, cs); got != mcpAllTools {
		t.Fatalf("tools: %s, want %s", got, mcpAllTools)
	}
	for name, want := range map[string][]string{
		"new_session": nil, "list_files": {"session"}, "read_file": {"session", "path"},
		"write_file": {"session", "path", "content"}, "fork_session": {"session", "count"},
	} {
		tool := mcpTool(t, cs, name)
		b, _ := json.Marshal(tool.InputSchema)
		var sch struct {
			Type       string                     `json:"type"`
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(b, &sch); err != nil || sch.Type != "object" ||
			strings.Join(sch.Required, ",") != strings.Join(want, ",") || tool.Description == "" {
			t.Errorf("%s: schema %s, description %q; want required %v", name, b, tool.Description, want)
		}
		for _, p := range want {
			if !strings.Contains(string(sch.Properties[p]), "description") {
				t.Errorf("%s: %s has no description: %s", name, p, b)
			}
		}
	}

	id := newMCPSession(t, cs)
	if res := callTool(t, cs, "write_file", map[string]any{"session": id, "path": "in/data.txt", "content": "from the model"}); res.IsError {
		t.Fatalf("write_file: %q", answerText(t, res))
	}
	res := call(t, cs, map[string]any{"session": id, "code": `import os
print(open("in/data.txt").read())
os.makedirs("out", exist_ok=True)
open("out/result.txt", "w").write("from the run")
open("out/raw.bin", "wb").write(b"\xff\x00\xfe")
open("big", "wb").write(b"a" * (17 << 20))`})
	out := structured(t, res)
	if res.IsError || out.Stdout != "from the model\n" || out.Session != id {
		t.Fatalf("run_code in the session: %v %q, session %q", res.IsError, answerText(t, res), out.Session)
	}

	if res := callTool(t, cs, "read_file", map[string]any{"session": id, "path": "out/result.txt"}); res.IsError || answerText(t, res) != "from the run" {
		t.Errorf("read_file: %v %q", res.IsError, answerText(t, res))
	}
	res = callTool(t, cs, "read_file", map[string]any{"session": id, "path": "out/raw.bin"})
	if er, ok := res.Content[0].(*mcp.EmbeddedResource); res.IsError || !ok || string(er.Resource.Blob) != "\xff\x00\xfe" || er.Resource.Text != "" {
		t.Errorf("read_file of bytes: %v %+v", res.IsError, res.Content[0])
	}

	res = callTool(t, cs, "list_files", map[string]any{"session": id})
	var l session.Listing
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &l); res.IsError || err != nil {
		t.Fatalf("list_files: %v %q %v", res.IsError, answerText(t, res), err)
	}
	names := map[string]string{}
	for _, f := range l.Files {
		names[f.Name] = f.Type
	}
	if names["in/data.txt"] != "file" || names["out/result.txt"] != "file" || names["out"] != "dir" || names["main.py"] != "file" {
		t.Errorf("list_files: %v", names)
	}
	if txt := answerText(t, res); !strings.Contains(txt, `"in/data.txt"`) || !strings.Contains(txt, `"out/result.txt"`) {
		t.Errorf("list_files text: %q", txt)
	}
	res = callTool(t, cs, "list_files", map[string]any{"session": id, "path": "out"})
	if txt := answerText(t, res); res.IsError || !strings.Contains(txt, "out/raw.bin") || strings.Contains(txt, "in/data.txt") {
		t.Errorf("list_files of out: %q", txt)
	}

	// Python runs in a session keep their globals; reset_state clears them.
	if res := call(t, cs, map[string]any{"session": id, "code": "kept = 41"}); res.IsError {
		t.Fatalf("run_code kept = 41: %q", answerText(t, res))
	}
	if res := call(t, cs, map[string]any{"session": id, "code": "kept + 1"}); res.IsError || !strings.Contains(allText(res), "42") {
		t.Errorf("run_code kept + 1 in the session: %v %q", res.IsError, allText(res))
	}
	if res := call(t, cs, map[string]any{"session": id, "code": "print('kept' in globals())", "reset_state": true}); res.IsError || structured(t, res).Stdout != "False\n" {
		t.Errorf("run_code with reset_state: %v %q", res.IsError, answerText(t, res))
	}

	// fork_session copies the files; the copy is a session of its own.
	res = callTool(t, cs, "fork_session", map[string]any{"session": id, "count": 1})
	var forked struct{ Sessions []string }
	b, _ = json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &forked); res.IsError || err != nil || len(forked.Sessions) != 1 || forked.Sessions[0] == id {
		t.Fatalf("fork_session: %v %q %s", res.IsError, answerText(t, res), b)
	}
	copyID := forked.Sessions[0]
	if res := callTool(t, cs, "read_file", map[string]any{"session": copyID, "path": "out/result.txt"}); res.IsError || answerText(t, res) != "from the run" {
		t.Errorf("read_file of the fork: %v %q", res.IsError, answerText(t, res))
	}
	if res := callTool(t, cs, "write_file", map[string]any{"session": copyID, "path": "out/result.txt", "content": "the fork's"}); res.IsError {
		t.Errorf("write_file to the fork: %q", answerText(t, res))
	}
	if res := callTool(t, cs, "read_file", map[string]any{"session": id, "path": "out/result.txt"}); answerText(t, res) != "from the run" {
		t.Errorf("the source after a write to its fork: %q", answerText(t, res))
	}
	if res := callTool(t, cs, "fork_session", map[string]any{"session": id, "count": 65}); !res.IsError || !strings.Contains(answerText(t, res), "count") {
		t.Errorf("fork_session of 65: %v %q", res.IsError, answerText(t, res))
	}

	// Refusals: an unknown session, a bad path, a file over the cap, a
	// malformed id.
	forged := "ss-0123456789abcdef0123456789abcdef"
	for tool, args := range map[string]map[string]any{
		"list_files":   {"session": forged},
		"read_file":    {"session": forged, "path": "a"},
		"write_file":   {"session": forged, "path": "a", "content": "x"},
		"fork_session": {"session": forged, "count": 1},
		"run_code":     {"session": forged, "code": "print(1)"},
	} {
		res := callTool(t, cs, tool, args)
		if txt := answerText(t, res); !res.IsError || !strings.Contains(txt, tool+" refused") || !strings.Contains(txt, forged) {
			t.Errorf("%s on an unknown session: %v %q", tool, res.IsError, txt)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.StoreDir, "sessions", forged)); err == nil {
		t.Error("a call on an unknown session made it")
	}
	for tool, args := range map[string]map[string]any{
		"read_file":  {"session": id, "path": "../../etc/passwd"},
		"write_file": {"session": id, "path": "/etc/passwd", "content": "x"},
		"list_files": {"session": id, "path": "../.."},
	} {
		res := callTool(t, cs, tool, args)
		if txt := answerText(t, res); !res.IsError || !strings.Contains(txt, tool+" refused: bad file name") {
			t.Errorf("%s on a bad path: %v %q", tool, res.IsError, txt)
		}
	}
	res = callTool(t, cs, "read_file", map[string]any{"session": id, "path": "big"})
	if txt := answerText(t, res); !res.IsError || !strings.Contains(txt, "read_file refused: file too large") {
		t.Errorf("read_file over the cap: %v %q", res.IsError, txt)
	}
	if res := call(t, cs, map[string]any{"session": "chat-42", "code": "print(1)"}); !res.IsError || !strings.Contains(answerText(t, res), "session") {
		t.Errorf("run_code with a malformed session: %v %q", res.IsError, answerText(t, res))
	}

	// Busy: while a run holds the session, the others are refused.
	var wg sync.WaitGroup
	wg.Add(1)
	var slow *mcp.CallToolResult
	go func() {
		defer wg.Done()
		slow = callTool(t, cs, "run_code", map[string]any{"session": id, "code": "import time; time.sleep(3)"})
	}()
	waitSessionBusy(t, id)
	for tool, args := range map[string]map[string]any{
		"list_files": {"session": id},
		"read_file":  {"session": id, "path": "in/data.txt"},
		"write_file": {"session": id, "path": "in/data.txt", "content": "x"},
		"run_code":   {"session": id, "code": "print(1)"},
	} {
		res := callTool(t, cs, tool, args)
		if txt := answerText(t, res); !res.IsError || !strings.Contains(txt, tool+" refused") || !strings.Contains(txt, "busy") {
			t.Errorf("%s on a busy session: %v %q", tool, res.IsError, txt)
		}
	}
	wg.Wait()
	if slow.IsError {
		t.Errorf("the run holding the session: %q", answerText(t, slow))
	}
	if res := callTool(t, cs, "read_file", map[string]any{"session": id, "path": "in/data.txt"}); res.IsError || answerText(t, res) != "from the model" {
		t.Errorf("after the busy run: %v %q", res.IsError, answerText(t, res))
	}
	assertNoLeaks(t)
}

// TestMCPSessionFull: write_file into a session past sessions.max_bytes is
// refused as too large, and keeps nothing of the file; so is run_code
// with files that do not fit, naming the file and the bound, never a
// host path.
func TestMCPSessionFull(t *testing.T) {
	removeNewSessions(t)
	cfg := testConfig(t)
	cfg.Sessions.MaxBytes = config.MustSize("16m")
	cs := inProcessMCP(t, cfg, nil)
	id := newMCPSession(t, cs)
	content := strings.Repeat("a", 6<<20)
	var res *mcp.CallToolResult
	for i := range 3 {
		res = callTool(t, cs, "write_file", map[string]any{"session": id, "path": fmt.Sprintf("f%d", i), "content": content})
		if res.IsError {
			break
		}
	}
	if txt := answerText(t, res); !res.IsError || !strings.Contains(txt, "write_file refused: file too large: the session is full") {
		t.Fatalf("writing past sessions.max_bytes: %v %q", res.IsError, txt)
	}
	if res := callTool(t, cs, "read_file", map[string]any{"session": id, "path": "f2"}); !res.IsError || !strings.Contains(answerText(t, res), "no such file") {
		t.Errorf("the file that did not fit was kept: %q", answerText(t, res))
	}
	res = callTool(t, cs, "run_code", map[string]any{"session": id, "code": "print(1)", "files": map[string]string{"big.bin": content}})
	if txt := answerText(t, res); !res.IsError || !strings.Contains(txt, `run_code refused: writing workspace file "big.bin": no room`) ||
		!strings.Contains(txt, "sessions.max_bytes") || strings.Contains(txt, cfg.StateDir) {
		t.Errorf("run_code with files past the session's disk: %v %q", res.IsError, txt)
	}
	assertNoLeaks(t)
}

// allText is the text of every text content of an answer, a line each.
func allText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text + "\n")
		}
	}
	return b.String()
}
