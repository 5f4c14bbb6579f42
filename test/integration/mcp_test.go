package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/server"
)

// mcpClient connects the SDK's own client over transport.
func mcpClient(t *testing.T, transport mcp.Transport) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// inProcessMCP is the MCP server as serve mounts it (run_code, the
// kept-session tools and the live-sandbox tools), with a real runner
// under cfg, and an SDK client connected to it in memory.
func inProcessMCP(t *testing.T, cfg *config.Config, log *audit.Log) *mcp.ClientSession {
	t.Helper()
	r, err := compose.Runner(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	api := server.New(cfg, r.Run, nil)
	api.Sessions = r.Sessions()
	api.Sandboxes = sandbox.NewDoor(r, cfg.Sandboxes)
	s := mcpserver.New(cfg, api.RunTask, t.Logf)
	s.AddSessions(api.Sessions)
	s.AddShell(func(ctx context.Context) (runapi.Sandbox, error) {
		return api.NewSandbox(ctx, &server.SandboxRequest{}, "")
	})
	st, ct := mcp.NewInMemoryTransports()
	ss, err := s.MCP().Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close(); s.Close() })
	return mcpClient(t, ct)
}

// call calls run_code with args.
func call(t *testing.T, cs *mcp.ClientSession, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	return callTool(t, cs, "run_code", args)
}

// callTool calls tool with args.
func callTool(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// answerText is the text block of an answer.
func answerText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if len(res.Content) == 0 {
		t.Fatalf("answer without content: %+v", res)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("first content is %T, want text", res.Content[0])
	}
	return tc.Text
}

// structured decodes an answer's structuredContent.
func structured(t *testing.T, res *mcp.CallToolResult) mcpserver.Output {
	t.Helper()
	var out mcpserver.Output
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil || res.StructuredContent == nil {
		t.Fatalf("structuredContent %v: %v", res.StructuredContent, err)
	}
	return out
}

// TestMCPRunCode drives run_code with the SDK's client over in-memory
// transports against real sandboxes: the schema the model sees, a happy
// path, images and files collected, truncation, timeout, OOM and a
// non-zero exit as normal answers, refusals naming the argument, and bad
// arguments, each answered with a clear error and nothing left on the host.
func TestMCPRunCode(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.Memory = config.MustSize("64m")
	cs := inProcessMCP(t, cfg, nil)

	runCode := mcpTool(t, cs, "run_code")
	schema, _ := json.Marshal(runCode.InputSchema)
	var sch struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			Enum        []string `json:"enum"`
			Description string   `json:"description"`
			MaxLength   int      `json:"maxLength"`
		} `json:"properties"`
		AdditionalProperties bool `json:"additionalProperties"`
	}
	if err := json.Unmarshal(schema, &sch); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sch.Properties["language"].Enum, ","); got != strings.Join(config.LanguageNames(cfg), ",") {
		t.Errorf("language enum %q; want the config's languages %v", got, config.LanguageNames(cfg))
	}
	if d := sch.Properties["timeout"].Description; !strings.Contains(d, "at most "+cfg.Policy.Timeout.String()) {
		t.Errorf("timeout description %q does not name the policy maximum %s", d, cfg.Policy.Timeout)
	}
	for _, p := range []string{"code", "files", "stdin", "collect", "network_allow", "timeout", "session"} {
		if _, ok := sch.Properties[p]; !ok {
			t.Errorf("schema has no %q: %s", p, schema)
		}
	}
	// No tool server or service in this config: their arguments are not
	// offered at all.
	for _, p := range []string{"tools", "network_services"} {
		if _, ok := sch.Properties[p]; ok {
			t.Errorf("schema offers %q with none configured: %s", p, schema)
		}
	}
	if !strings.Contains(runCode.Description, "final expression") || !strings.Contains(runCode.Description, "plt.show()") {
		t.Errorf("run_code's description does not tell of values and figures: %s", runCode.Description)
	}
	if len(sch.Required) != 1 || sch.Required[0] != "code" || sch.Properties["code"].MaxLength != mcpserver.MaxCodeChars {
		t.Errorf("schema: required %v, code maxLength %d", sch.Required, sch.Properties["code"].MaxLength)
	}
	if runCode.OutputSchema == nil {
		t.Error("no output schema")
	}

	t.Run("happy", func(t *testing.T) {
		res := call(t, cs, map[string]any{"code": "import sys; print(45); print('warn', file=sys.stderr)"})
		text, out := answerText(t, res), structured(t, res)
		if res.IsError || !strings.Contains(text, "stdout:\n45\n") || !strings.Contains(text, "stderr:\nwarn\n") ||
			!strings.Contains(text, "exit code 0") || !strings.Contains(text, out.ID) {
			t.Errorf("answer %v %q", res.IsError, text)
		}
		if out.Stdout != "45\n" || out.ExitCode != 0 || !strings.HasPrefix(out.Session, "mcp-") || !strings.HasPrefix(out.ID, "ar-") {
			t.Errorf("structured %+v", out)
		}
		assertNoLeaks(t)
	})

	t.Run("files", func(t *testing.T) {
		// A real 1x1 PNG made in the sandbox, a text file, a binary file,
		// and one named .png that is not an image.
		code := `import zlib, struct, os
def chunk(k, d): return struct.pack('>I', len(d)) + k + d + struct.pack('>I', zlib.crc32(k + d))
png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0)) + chunk(b'IDAT', zlib.compress(b'\x00\xff\x00\x00')) + chunk(b'IEND', b'')
os.makedirs('out', exist_ok=True)
open('out/plot.png', 'wb').write(png)
open('out/fake.png', 'w').write('not an image')
open('report.md', 'w').write('# Report\n')
open('data.bin', 'wb').write(bytes([0xff, 0xfe, 0x00, 0x80]))
print(open('input.txt').read())`
		res := call(t, cs, map[string]any{"code": code, "files": map[string]string{"input.txt": "given"},
			"collect": []string{"out/*.png", "report.md", "data.bin"}})
		if res.IsError {
			t.Fatalf("answer: %q", answerText(t, res))
		}
		var images, texts, blobs int
		for _, c := range res.Content[1:] {
			switch c := c.(type) {
			case *mcp.ImageContent:
				images++
				if c.MIMEType != "image/png" || len(c.Data) < 50 || string(c.Data[1:4]) != "PNG" {
					t.Errorf("image %s %d bytes", c.MIMEType, len(c.Data))
				}
			case *mcp.EmbeddedResource:
				switch c.Resource.URI {
				case "file:///workspace/report.md":
					texts++
					if c.Resource.Text != "# Report\n" {
						t.Errorf("report.md: %q", c.Resource.Text)
					}
				case "file:///workspace/out/fake.png":
					texts++
				case "file:///workspace/data.bin":
					blobs++
					if string(c.Resource.Blob) != "\xff\xfe\x00\x80" || c.Resource.Text != "" {
						t.Errorf("data.bin: %q %q", c.Resource.Blob, c.Resource.Text)
					}
				default:
					t.Errorf("unexpected resource %s", c.Resource.URI)
				}
			default:
				t.Errorf("unexpected content %T", c)
			}
		}
		if images != 1 || texts != 2 || blobs != 1 {
			t.Errorf("images %d, text resources %d, blobs %d; want 1, 2, 1", images, texts, blobs)
		}
		out := structured(t, res)
		if out.Files["out/plot.png"].Returned != "image" || out.Files["data.bin"].Returned != "resource" || out.Stdout != "given\n" {
			t.Errorf("structured files %+v, stdout %q", out.Files, out.Stdout)
		}
	})

	t.Run("size cap", func(t *testing.T) {
		// Two files of 5 MiB: the second is past the answer's 8 MiB.
		res := call(t, cs, map[string]any{"code": "for n in 'ab': open(n, 'w').write('x' * (5 << 20))", "collect": []string{"a", "b"}})
		text, out := answerText(t, res), structured(t, res)
		if res.IsError || len(res.Content) != 2 || out.Files["a"].Returned != "resource" || out.Files["b"].Returned != "no" ||
			!strings.Contains(text, "b: not returned: over the answer's 8388608 bytes of files") {
			t.Errorf("answer %v %q, %d contents, files %+v", res.IsError, text, len(res.Content), out.Files)
		}
	})

	t.Run("truncated", func(t *testing.T) {
		res := call(t, cs, map[string]any{"code": "print('x' * 200000)"})
		text, out := answerText(t, res), structured(t, res)
		if res.IsError || !out.StdoutTruncated || out.StdoutBytes != 200001 || !strings.Contains(text, "stdout truncated: 65536 of 200001 bytes kept") ||
			!strings.Contains(text, "exit code 0, ") {
			t.Errorf("answer %v %q…; structured truncated %v bytes %d", res.IsError, text[len(text)-200:], out.StdoutTruncated, out.StdoutBytes)
		}
	})

	t.Run("outcomes", func(t *testing.T) {
		for _, c := range []struct {
			name string
			args map[string]any
			want string
			ok   func(mcpserver.Output) bool
		}{
			{"exit", map[string]any{"code": "import sys; sys.exit(3)"}, "exit code 3", func(o mcpserver.Output) bool { return o.ExitCode == 3 }},
			{"timeout", map[string]any{"code": "while True: pass", "timeout": "1s"}, "timed out", func(o mcpserver.Output) bool {
				return o.TimedOut && o.ExitCode == result.ExitTimeout
			}},
			{"oom", map[string]any{"code": "x = bytearray(200 << 20)"}, "out of memory (OOM)", func(o mcpserver.Output) bool {
				return o.OOMKilled && o.ExitCode == result.ExitKilled
			}},
			{"shell", map[string]any{"language": "sh", "code": "echo $0 >&2; exit 2"}, "exit code 2", func(o mcpserver.Output) bool { return o.ExitCode == 2 }},
			{"no network", map[string]any{"code": "import socket; socket.gethostbyname('pypi.org')"}, ", no network;", func(o mcpserver.Output) bool {
				return o.ExitCode == 1 && o.Network.None && o.Network.Note == result.NoNetworkNote
			}},
		} {
			res := call(t, cs, c.args)
			text := answerText(t, res)
			if res.IsError || !strings.Contains(text, c.want) || !c.ok(structured(t, res)) {
				t.Errorf("%s: answer %v %q; want a normal answer saying %q", c.name, res.IsError, text, c.want)
			}
		}
		assertNoLeaks(t)
	})

	t.Run("refused", func(t *testing.T) {
		big := strings.Repeat("#", 10<<20)
		for _, c := range []struct {
			name string
			args map[string]any
			want []string
		}{
			{"over policy", map[string]any{"code": "print(1)", "timeout": "5m"}, []string{"timeout", "exceeds policy maximum 60s"}},
			{"bad duration", map[string]any{"code": "print(1)", "timeout": "soon"}, []string{"timeout"}},
			{"unknown language", map[string]any{"code": "x", "language": "cobol"}, []string{"language", "cobol", "python"}},
			{"wrong type", map[string]any{"code": 42}, []string{"code", "string"}},
			{"no code", map[string]any{"language": "python"}, []string{"code"}},
			{"unknown argument", map[string]any{"code": "print(1)", "image": "alpine"}, []string{"image"}},
			{"10 MB of code", map[string]any{"code": big}, []string{"code", "maxLength"}},
			{"escaping file", map[string]any{"code": "print(1)", "files": map[string]string{"../x": "y"}}, []string{`files["../x"]`}},
			{"network", map[string]any{"code": "print(1)", "network_allow": []string{"http://x y"}}, []string{"network_allow"}},
		} {
			res := call(t, cs, c.args)
			text := answerText(t, res)
			if !res.IsError || res.StructuredContent != nil || len(text) > mcpserver.MaxErrorChars+100 {
				t.Errorf("%s: not a short error answer (%d bytes): %.200q", c.name, len(text), text)
			}
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s: answer %q does not name %q", c.name, text, w)
				}
			}
		}
		assertNoLeaks(t)
	})
}

// TestMCPHostFailureIsGeneric: when agentrun itself fails (the config's
// image is missing), the model gets a generic text with the run id, while
// the audit record holds the detail.
func TestMCPHostFailureIsGeneric(t *testing.T) {
	cfg := testConfig(t)
	missing := filepath.Join(t.TempDir(), "no-such-rootfs")
	cfg.Image = "dir:" + missing
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	log, err := audit.Open(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cs := inProcessMCP(t, cfg, log)

	res := call(t, cs, map[string]any{"code": "print(1)"})
	text := answerText(t, res)
	if !res.IsError || res.StructuredContent != nil || strings.Contains(text, missing) || strings.Contains(text, "no-such") ||
		!strings.Contains(text, "problem on the host") {
		t.Fatalf("answer %v %q; want a generic error", res.IsError, text)
	}
	b, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	var rec audit.Record
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("audit %q: %v", b, err)
	}
	if !strings.Contains(rec.Error, missing) || !strings.Contains(text, "run "+rec.ID) || !strings.HasPrefix(rec.Session, "mcp-") {
		t.Errorf("audit record %+v; answer %q: want the detail in the record and its id in the answer", rec, text)
	}
	assertNoLeaks(t)
}

// TestMCPQuota: a call over its session's quota is an error answer that
// says when to try again; one MCP session is one quota session.
func TestMCPQuota(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.Quota.RunsPerMinute = 1
	cs := inProcessMCP(t, cfg, nil)
	if res := call(t, cs, map[string]any{"code": "print(1)"}); res.IsError {
		t.Fatalf("first run: %q", answerText(t, res))
	}
	res := call(t, cs, map[string]any{"code": "print(1)"})
	if text := answerText(t, res); !res.IsError || !strings.Contains(text, "1 runs per minute") || !strings.Contains(text, "try again in") {
		t.Errorf("over quota: %v %q", res.IsError, text)
	}
	assertNoLeaks(t)
}

// mcpConfig writes the config `agentrun mcp` runs tasks with as root.
func mcpConfig(t *testing.T, auditPath string) string {
	return writeConfig(t, map[string]any{"image": pythonImage, "state_dir": stateDir,
		"store_dir": filepath.Join(stateDir, "store"), "audit": auditPath})
}

// TestMCPStdio: `agentrun mcp` as root with no server runs tasks itself,
// driven over the SDK's command transport.
func TestMCPStdio(t *testing.T) {
	// No flag but the config: root, and no server on the default socket.
	cmd := exec.Command(agentrunBin(t), "mcp", "--config", mcpConfig(t, ""))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	hideDefaultServer(t, cmd)
	cmd.Stderr = os.Stderr
	cs := mcpClient(t, &mcp.CommandTransport{Command: cmd})
	if init := cs.InitializeResult(); init.ServerInfo.Name != "agentrun" {
		t.Errorf("server info %+v", init.ServerInfo)
	}
	res := call(t, cs, map[string]any{"code": "print(45)"})
	if text := answerText(t, res); res.IsError || !strings.Contains(text, "45\n") {
		t.Fatalf("answer %v %q", res.IsError, text)
	}
	if err := cs.Close(); err != nil {
		t.Errorf("closing: %v", err)
	}
	assertNoLeaks(t)
}

// hideDefaultServer makes cmd run as on a host where no serve listens on
// the default socket, when another agentrun's serve (an operator's, on a
// shared host) does: in a mount namespace of its own, /dev/null is bound
// over the socket, so that connecting to it is refused as to a socket
// nobody holds. Nothing else of the host is hidden (the host-wide uid
// reservations beside the socket stay shared).
func hideDefaultServer(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	sock := config.Default().Server.Listen.Address
	if _, err := os.Lstat(sock); err != nil {
		return
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatalf("a server listens on %s, and hiding it needs unshare (util-linux): %v", sock, err)
	}
	cmd.Args = append([]string{unshare, "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", `mount --bind /dev/null "$0" && exec "$@"`, sock}, cmd.Args...)
	cmd.Path = unshare
}

// rawMCP is `agentrun mcp` spoken to line by line, as a client that can
// misbehave.
type rawMCP struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

func startRawMCP(t *testing.T, cmd *exec.Cmd) *rawMCP {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &rawMCP{cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			m.lines <- sc.Text()
		}
		close(m.lines)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	m.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	m.expect(t, `"id":1`)
	m.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return m
}

func (m *rawMCP) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(m.in, line+"\n"); err != nil {
		t.Fatalf("writing to agentrun mcp: %v", err)
	}
}

func (m *rawMCP) expect(t *testing.T, want string) string {
	t.Helper()
	select {
	case l, ok := <-m.lines:
		if !ok || !strings.Contains(l, want) {
			t.Fatalf("agentrun mcp answered %q (open %v); want %s", l, ok, want)
		}
		return l
	case <-time.After(30 * time.Second):
		t.Fatalf("no answer from agentrun mcp; want %s", want)
	}
	return ""
}

// exits waits for the process to end by itself.
func (m *rawMCP) exits(t *testing.T) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- m.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("agentrun mcp did not exit")
	}
}

// waitRunning waits until a run's state dir exists.
func waitRunning(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(runningIDs()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the run never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runningIDs lists the runs whose state dir exists.
func runningIDs() []string {
	entries, _ := os.ReadDir(filepath.Join(stateDir, "runs"))
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

// TestMCPBadClients: a client that vanishes mid-run, and one that sends a
// malformed frame: `agentrun mcp` kills the sandbox, exits, and leaves
// nothing on the host; a cancelled call kills its run while the server
// goes on.
func TestMCPBadClients(t *testing.T) {
	cfgPath := mcpConfig(t, "")
	start := func() *rawMCP {
		return startRawMCP(t, exec.Command(agentrunBin(t), "mcp", "--local", "--config", cfgPath))
	}
	sleeper := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"import time; time.sleep(50)","timeout":"60s"}}}`

	t.Run("vanishes", func(t *testing.T) {
		m := start()
		m.send(t, sleeper)
		waitRunning(t)
		m.in.Close()
		m.exits(t)
		assertNoLeaks(t)
	})
	t.Run("malformed frame", func(t *testing.T) {
		m := start()
		m.send(t, sleeper)
		waitRunning(t)
		m.send(t, `{"jsonrpc":"2.0","id":3,"method":`)
		m.send(t, `}}}not json at all`)
		m.exits(t)
		assertNoLeaks(t)
	})
	t.Run("cancelled", func(t *testing.T) {
		m := start()
		m.send(t, sleeper)
		waitRunning(t)
		m.send(t, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"user"}}`)
		deadline := time.Now().Add(20 * time.Second)
		for len(runningIDs()) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		assertNoLeaks(t)
		m.expect(t, `run_code cancelled`)
		m.send(t, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"print(6*7)"}}}`)
		m.expect(t, `"stdout":"42\n"`)
		m.in.Close()
		m.exits(t)
	})
}

// clientDir is a directory under /run (as the suite's state dir) that
// any user can reach: for serve's socket and an unprivileged copy of the
// binary.
func clientDir(t *testing.T) string {
	t.Helper()
	return readableDir(t, "/run", "agentrun-client-")
}

// readableDir is a fresh directory in parent, named from prefix, that any
// user can reach; the test removes it.
func readableDir(t *testing.T, parent, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// copyBin copies the agentrun binary into dir (once), where a user
// without privilege can run it, and returns its path.
func copyBin(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "agentrun")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	b, err := os.ReadFile(agentrunBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// unprivilegedMCP is `agentrun mcp` run as nobody (uid 65534) with env.
func unprivilegedMCP(t *testing.T, dir string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(copyBin(t, dir), "mcp")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	cmd.Env = env
	return cmd
}

// TestMCPForwardsUnprivileged: `agentrun mcp` as uid 65534 forwards to a
// running serve over its socket (access by group only), whose MCP session
// is the agentrun session; with no server it says so and exits 1.
func TestMCPForwardsUnprivileged(t *testing.T) {
	removeNewSessions(t)
	dir := clientDir(t)
	sock := filepath.Join(dir, "agentrun.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "pool": map[string]int{pythonImage: 1}})
	if err := os.Chown(sock, 0, 65534); err != nil {
		t.Fatal(err)
	}

	cmd := unprivilegedMCP(t, dir, "AGENTRUN_SERVER=unix://"+sock)
	cmd.Stderr = os.Stderr
	cs := mcpClient(t, &mcp.CommandTransport{Command: cmd})
	if got := mcpToolNames(t, cs); got != mcpAllTools {
		t.Fatalf("tools/list through serve: %s, want %s", got, mcpAllTools)
	}
	// The kept-session tools are serve's: a file written through them is
	// read by a run in the session.
	kept := newMCPSession(t, cs)
	if res := callTool(t, cs, "write_file", map[string]any{"session": kept, "path": "in.txt", "content": "forwarded"}); res.IsError {
		t.Fatalf("write_file through serve: %q", answerText(t, res))
	}
	if res := call(t, cs, map[string]any{"code": "print(open('in.txt').read())", "session": kept}); res.IsError || structured(t, res).Stdout != "forwarded\n" {
		t.Fatalf("run_code in a session through serve: %q", answerText(t, res))
	}
	res := call(t, cs, map[string]any{"code": "import os; print(os.getuid(), 6 * 7)"})
	out := structured(t, res)
	if res.IsError || !sandboxUID42(out.Stdout) || !strings.HasPrefix(out.Session, "mcp-") {
		t.Fatalf("answer %v %q, structured %+v", res.IsError, answerText(t, res), out)
	}
	again := structured(t, call(t, cs, map[string]any{"code": "print(1)"}))
	if again.Session != out.Session {
		t.Errorf("sessions %q then %q: one MCP session should be one agentrun session", out.Session, again.Session)
	}
	if res := call(t, cs, map[string]any{"code": "print(1)", "timeout": "5m"}); !res.IsError || !strings.Contains(answerText(t, res), "timeout: 5m exceeds policy maximum") {
		t.Errorf("refusal through serve: %q", answerText(t, res))
	}

	// serve restarts: the next calls open a new session there.
	s.stop()
	s = startServe(t, map[string]any{"listen": "unix://" + sock})
	if err := os.Chown(sock, 0, 65534); err != nil {
		t.Fatal(err)
	}
	var after *mcp.CallToolResult
	for range 2 { // the first may find the old session's end first
		if after = call(t, cs, map[string]any{"code": "print(2)"}); !after.IsError {
			break
		}
	}
	if after.IsError || structured(t, after).Stdout != "2\n" {
		t.Errorf("after serve restarted: %q", answerText(t, after))
	}
	cs.Close()

	// A client that leaves mid-run: serve kills the run.
	m := startRawMCP(t, unprivilegedMCP(t, dir, "AGENTRUN_SERVER=unix://"+sock))
	m.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_code","arguments":{"code":"import time; time.sleep(50)","timeout":"60s"}}}`)
	s.waitHealth("the run going on", func(h server.Health) bool { return h.Running == 1 })
	m.in.Close()
	m.exits(t)
	s.waitIdle()

	// No server: a clear message, exit 1, as nobody cannot run tasks itself.
	var stderr strings.Builder
	none := unprivilegedMCP(t, dir, "AGENTRUN_SERVER=unix://"+filepath.Join(dir, "nothing.sock"))
	none.Stderr = &stderr
	none.Stdin = strings.NewReader("")
	if err := none.Run(); none.ProcessState.ExitCode() != 1 || !strings.Contains(stderr.String(), "nothing.sock") {
		t.Errorf("no server: %v: %s", err, stderr.String())
	}
	s.stop()
	assertNoLeaks(t)
}

// TestMCPOverHTTP: serve's /mcp speaks Streamable HTTP behind the same
// token as the rest of the API, on TCP and on its socket.
func TestMCPOverHTTP(t *testing.T) {
	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "sekrit"})
	resp, err := http.Post(s.base+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("/mcp without the token: %d; want 401", resp.StatusCode)
	}
	noToken := &mcp.StreamableClientTransport{Endpoint: s.base + "/mcp", MaxRetries: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(ctx, noToken, nil); err == nil {
		t.Error("connected to /mcp without the token")
	}
	// A malformed frame and one past the size cap: refused, serve goes on.
	for _, body := range []string{`{"jsonrpc":"2.0","id":1,"method":`, `{"x":"` + strings.Repeat("a", mcpserver.MaxFrameBytes) + `"}`} {
		req, _ := http.NewRequest("POST", s.base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sekrit")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest && resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("bad frame of %d bytes: %d; want 400 or 413", len(body), resp.StatusCode)
		}
	}

	// agentrun mcp with a wrong token: refused, and as root it does not
	// fall back to running tasks itself.
	var stderr strings.Builder
	wrong := exec.Command(agentrunBin(t), "mcp")
	wrong.Env = []string{"AGENTRUN_SERVER=tcp://" + strings.TrimPrefix(s.base, "http://"), "AGENTRUN_TOKEN=wrong"}
	wrong.Stdin, wrong.Stderr = strings.NewReader(""), &stderr
	if err := wrong.Run(); wrong.ProcessState.ExitCode() != 1 || !strings.Contains(stderr.String(), "401") {
		t.Errorf("wrong token: %v: %s", err, stderr.String())
	}
	c, err := server.NewClient("tcp://"+strings.TrimPrefix(s.base, "http://"), "sekrit")
	if err != nil {
		t.Fatal(err)
	}
	url, hc := c.HTTP("/mcp")
	cs := mcpClient(t, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1})
	res := call(t, cs, map[string]any{"code": "print(45)"})
	if out := structured(t, res); res.IsError || out.Stdout != "45\n" || out.Session != "mcp-"+cs.ID() {
		t.Fatalf("answer %v %q, session %q; want the MCP session mcp-%s", res.IsError, answerText(t, res), out.Session, cs.ID())
	}
	// SIGTERM with the session still open: serve closes it and stops.
	s.stop()
	assertNoLeaks(t)
}

// TestMCPTypeScriptClient: the official TypeScript SDK's client (from
// npm, test/mcp-client) drives `agentrun mcp` over stdio and serve's /mcp
// over HTTP.
func TestMCPTypeScriptClient(t *testing.T) {
	removeNewSessions(t)
	dir := npmPackages(t, "mcp-client", "@modelcontextprotocol/sdk")
	node := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("node", append([]string{filepath.Join(dir, "client.mjs")}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node client.mjs %v: %v\n%s\n%s", args[0], err, out, stderr.String())
		}
		return string(out)
	}
	out := node("stdio", agentrunBin(t), "mcp", "--local", "--config", mcpConfig(t, ""))
	if !strings.Contains(out, "ok stdio") {
		t.Errorf("stdio: %s", out)
	}
	s := startServe(t, map[string]any{"listen": "tcp://127.0.0.1:0", "token": "sekrit"})
	out = node("http", s.base+"/mcp", "sekrit")
	if !strings.Contains(out, "ok http") {
		t.Errorf("http: %s", out)
	}
	s.stop()
	assertNoLeaks(t)
}
