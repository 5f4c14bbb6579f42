package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// Names of the live-sandbox tools (spec §17): Codex's pair.
const (
	ExecTool  = "exec_command"
	StdinTool = "write_stdin"
)

// Bounds of the live-sandbox tools' calls.
const (
	// DefaultYieldMS is how long a call waits for output by default;
	// MaxYieldMS the most it waits (a longer yield_time_ms is clamped).
	DefaultYieldMS = 10000
	MaxYieldMS     = 30000
	// MaxShellOutput bounds the output one answer carries: past it, its
	// first and last halves are kept and the bytes between them counted.
	MaxShellOutput = 64 << 10
	// MaxCmdChars bounds exec_command's cmd, MaxChars write_stdin's
	// chars (one write to a process's stdin, as serve's).
	MaxCmdChars = 64 << 10
	MaxChars    = 1 << 20
)

// SandboxFunc makes a live sandbox of the config's defaults for an MCP
// session. It fails with a *runapi.Refusal (past sandboxes.max: to be
// tried again), or an error of errkind's kinds, as TaskFunc does.
// server.Server.NewSandbox, with an empty request, is one.
type SandboxFunc func(ctx context.Context) (runapi.Sandbox, error)

// ExecArgs are exec_command's arguments.
type ExecArgs struct {
	Cmd         string `json:"cmd"`
	Workdir     string `json:"workdir,omitempty"`
	YieldTimeMS *int   `json:"yield_time_ms,omitempty"`
}

// StdinArgs are write_stdin's arguments.
type StdinArgs struct {
	Process     int    `json:"process"`
	Chars       string `json:"chars,omitempty"`
	CloseStdin  bool   `json:"close_stdin,omitempty"`
	YieldTimeMS *int   `json:"yield_time_ms,omitempty"`
}

// ShellOutput is exec_command's and write_stdin's structuredContent:
// the output printed since the last answer about the process (stdout
// and stderr as they came), then its exit code once it has ended, or
// its id while it runs.
type ShellOutput struct {
	Output   string `json:"output"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Process  int    `json:"process,omitempty"`
	// CutBytes counts the output bytes left out of this answer (past
	// MaxShellOutput, or dropped by the sandbox's bound on what a
	// process's output it keeps).
	CutBytes int64 `json:"cut_bytes,omitempty"`
}

// shell is an MCP session's live sandbox, made at its first use, and
// where each of its processes' output was read up to.
type shell struct {
	mu     sync.Mutex
	sb     runapi.Sandbox
	seq    map[int]int // by pid: the next event to read; gone once its exit was told
	closed bool
}

// AddShell adds exec_command and write_stdin, which run commands in one
// live sandbox per MCP session, made by create at the session's first
// call and ended with the session (or by its timeout, which each call
// sets again to sandboxes.default_timeout from then, within its max
// lifetime); Close ends every one.
func (s *Server) AddShell(create SandboxFunc) {
	s.mu.Lock()
	s.newSandbox = create
	s.mu.Unlock()
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  ExecTool,
		Title: "Run a shell command in a live sandbox",
		Description: "Run a shell command (/bin/sh -c) in this conversation's live Linux sandbox, an unprivileged user's, " +
			"with no network. The sandbox is made at the first call and kept until the conversation ends " +
			"(or it sits idle past its timeout): files in /workspace (the default directory) and /tmp, and processes " +
			"left running, persist from one call to the next; each command starts in its own shell, so cd and variables do not. " +
			"The call waits up to yield_time_ms for the command to end: then the answer has its output and exit_code. " +
			"A command still running then goes on in the background, and the answer has what it printed so far and its process id: " +
			"call write_stdin with that process to type into its stdin, or with empty chars to wait for more output and its exit. " +
			fmt.Sprintf("An answer carries at most %d bytes of output (the middle of longer output is cut, and says so).", MaxShellOutput),
		InputSchema:  execSchema(),
		OutputSchema: shellOutputSchema(),
		Annotations:  &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, s.execCommand)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  StdinTool,
		Title: "Write to a running process, or read its output",
		Description: "Write chars to the stdin of a process that exec_command left running (a REPL, a prompt, cat), then wait " +
			"up to yield_time_ms for it to end, answering as exec_command does: the output printed since the last answer about it, " +
			"and exit_code once it has ended, else the process id again. With empty chars it only waits and reads: " +
			"the way to follow a long command. Include \"\\n\" to send a line. There is no terminal: end its input with close_stdin, and stop it with a command such as kill.",
		InputSchema:  stdinSchema(),
		OutputSchema: shellOutputSchema(),
		Annotations:  &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)},
	}, s.writeStdin)
}

func yieldSchema() *jsonschema.Schema {
	return &jsonschema.Schema{Type: "integer",
		Description: fmt.Sprintf("How long to wait for the process to end before answering with what it printed so far, in ms: "+
			"%d by default, 0 to %d (a longer one is cut to %d).", DefaultYieldMS, MaxYieldMS, MaxYieldMS)}
}

func execSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:     "object",
		Required: []string{"cmd"},
		Properties: map[string]*jsonschema.Schema{
			"cmd": {Type: "string", MinLength: ptr(1), MaxLength: ptr(MaxCmdChars),
				Description: "The shell command line, run by /bin/sh -c, e.g. \"ls -la\" or \"python3 -m pytest -q 2>&1 | tail -20\"."},
			"workdir": {Type: "string", MaxLength: ptr(4096),
				Description: "Its working directory: absolute, or relative to /workspace (the default)."},
			"yield_time_ms": yieldSchema(),
		},
		AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}},
	}
}

func stdinSchema() *jsonschema.Schema {
	return &jsonschema.Schema{
		Type:     "object",
		Required: []string{"process"},
		Properties: map[string]*jsonschema.Schema{
			"process": {Type: "integer", Minimum: ptr(1.0),
				Description: "The process id an answer of exec_command (or write_stdin) gave."},
			"chars": {Type: "string", MaxLength: ptr(MaxChars),
				Description: "Text to write to its stdin; empty to only read what it printed since."},
			"close_stdin": {Type: "boolean",
				Description: "After chars, close its stdin: the end of its input (as ^D at a terminal)."},
			"yield_time_ms": yieldSchema(),
		},
		AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}},
	}
}

func shellOutputSchema() *jsonschema.Schema {
	sc, err := jsonschema.For[ShellOutput](nil)
	if err != nil {
		panic(fmt.Sprintf("exec_command output schema: %v", err)) // a fixed type: a bug here
	}
	return sc
}

// yield is the wait a call asked for, clamped.
func yield(ms *int) time.Duration {
	switch {
	case ms == nil:
		return DefaultYieldMS * time.Millisecond
	case *ms < 0:
		return 0
	case *ms > MaxYieldMS:
		return MaxYieldMS * time.Millisecond
	}
	return time.Duration(*ms) * time.Millisecond
}

func (s *Server) execCommand(ctx context.Context, req *mcp.CallToolRequest, a ExecArgs) (*mcp.CallToolResult, any, error) {
	ctx, done := s.track(ctx, req.Session)
	defer done()
	sh := s.shellOf(req.Session)
	sb, note, err := s.sandboxOf(ctx, sh)
	if err != nil {
		return s.shellError(ExecTool, err), nil, nil
	}
	p, err := sb.Exec(runapi.ExecRequest{Cmd: a.Cmd, Cwd: a.Workdir, Stdin: true})
	if err != nil {
		return s.shellError(ExecTool, err), nil, nil
	}
	return s.answerShell(ctx, sh, p, 0, yield(a.YieldTimeMS), note)
}

func (s *Server) writeStdin(ctx context.Context, req *mcp.CallToolRequest, a StdinArgs) (*mcp.CallToolResult, any, error) {
	ctx, done := s.track(ctx, req.Session)
	defer done()
	sh := s.shellOf(req.Session)
	sh.mu.Lock()
	sb, seq, ok := sh.sb, 0, false
	if sb != nil {
		seq, ok = sh.seq[a.Process]
	}
	sh.mu.Unlock()
	var p runapi.Process
	if ok {
		p = sb.Process(a.Process)
	}
	if p == nil {
		return errorResult(fmt.Sprintf("%s refused: no process %d is running in this conversation's sandbox "+
			"(it ended and its exit was already answered, or the sandbox ended, or exec_command never gave it)", StdinTool, a.Process)), nil, nil
	}
	if a.Chars != "" || a.CloseStdin {
		if err := p.WriteStdin([]byte(a.Chars), a.CloseStdin); err != nil {
			return s.shellError(StdinTool, err), nil, nil
		}
	}
	return s.answerShell(ctx, sh, p, seq, yield(a.YieldTimeMS), "")
}

// answerShell reads p's output from seq on for up to wait, or until it
// ends, and answers with it; note, if any, heads the text.
func (s *Server) answerShell(ctx context.Context, sh *shell, p runapi.Process, seq int, wait time.Duration, note string) (*mcp.CallToolResult, any, error) {
	out, next, exit := readOutput(ctx, p, seq, wait)
	sh.mu.Lock()
	if exit != nil {
		delete(sh.seq, p.Pid())
	} else {
		sh.seq[p.Pid()] = next
	}
	sh.mu.Unlock()
	if exit == nil && ctx.Err() != nil {
		return errorResult(fmt.Sprintf("cancelled: process %d goes on in the sandbox; write_stdin with it reads its output", p.Pid())), nil, nil
	}
	res := &ShellOutput{Output: out.String(), CutBytes: out.cut}
	var b strings.Builder
	if note != "" {
		b.WriteString("[" + note + "]\n")
	}
	b.WriteString(res.Output)
	if res.Output != "" && !strings.HasSuffix(res.Output, "\n") {
		b.WriteString("\n")
	}
	if out.cut > 0 || out.lost {
		fmt.Fprintf(&b, "[output cut: an answer carries at most %d bytes, and the sandbox keeps a bounded tail of a process's output; %d bytes left out]\n", MaxShellOutput, out.cut)
	}
	switch {
	case exit == nil:
		res.Process = p.Pid()
		fmt.Fprintf(&b, "[process %d is still running: write_stdin with process %d reads what it prints next (empty chars) or writes to its stdin]", p.Pid(), p.Pid())
	case exit.Signal != "":
		res.ExitCode, res.Signal = exit.ExitCode, exit.Signal
		fmt.Fprintf(&b, "[killed by %s]", exit.Signal)
	default:
		res.ExitCode = exit.ExitCode
		fmt.Fprintf(&b, "[exit code %d]", deref(exit.ExitCode))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, res, nil
}

// readOutput reads p's events from seq on until it ends, wait passes or
// ctx ends: the output they carry, the next seq, and its exit event if
// it ended.
func readOutput(ctx context.Context, p runapi.Process, seq int, wait time.Duration) (*cappedOutput, int, *runapi.ProcessEvent) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	out := &cappedOutput{}
	for {
		evs, next, done := p.Next(ctx, seq)
		if skipped := next - len(evs) - seq; skipped > 0 {
			out.lost = true // events dropped past the process's bound
		}
		seq = next
		var exit *runapi.ProcessEvent
		for i, e := range evs {
			switch {
			case e.Event == "exit":
				exit = &evs[i]
			case e.DataB64 != "":
				data, _ := base64.StdEncoding.DecodeString(e.DataB64)
				out.write(string(data))
			default:
				out.write(e.Data)
			}
		}
		if done {
			if exit == nil {
				exit = p.Exit()
			}
			if exit != nil {
				out.cut += exit.Dropped
			}
			return out, seq, exit
		}
		if ctx.Err() != nil {
			return out, seq, nil
		}
	}
}

// cappedOutput keeps the first and the last MaxShellOutput/2 bytes of
// what is written to it, and counts the rest.
type cappedOutput struct {
	head, tail []byte
	cut        int64
	lost       bool
}

func (c *cappedOutput) write(s string) {
	const half = MaxShellOutput / 2
	if n := min(half-len(c.head), len(s)); n > 0 {
		c.head = append(c.head, s[:n]...)
		s = s[n:]
	}
	if s == "" {
		return
	}
	c.tail = append(c.tail, s...)
	if over := len(c.tail) - half; over > 0 {
		c.cut += int64(over)
		c.tail = append(c.tail[:0], c.tail[over:]...)
	}
}

// String is the output kept, valid UTF-8 (a character cut in two is
// replaced), with a mark where bytes were cut.
func (c *cappedOutput) String() string {
	s := string(c.head)
	if c.cut > 0 {
		s += "\n[…]\n"
	}
	return strings.ToValidUTF8(s+string(c.tail), "\uFFFD")
}

// shellOf is ss's shell, made at its first call; the shell's sandbox
// ends with the session.
func (s *Server) shellOf(ss *mcp.ServerSession) *shell {
	s.mu.Lock()
	sh := s.shells[ss]
	made := sh == nil
	if made {
		if s.shells == nil {
			s.shells = map[*mcp.ServerSession]*shell{}
		}
		sh = &shell{seq: map[int]int{}, closed: s.shellsClosed}
		s.shells[ss] = sh
	}
	s.mu.Unlock()
	if made && ss != nil {
		ended := s.sessionEnded(ss)
		go func() {
			<-ended
			s.endShell(ss)
		}()
	}
	return sh
}

// endShell ends ss's shell: its sandbox is closed. The shell stays
// listed until then, so that a Close meanwhile waits for it.
func (s *Server) endShell(ss *mcp.ServerSession) {
	s.mu.Lock()
	sh := s.shells[ss]
	s.mu.Unlock()
	if sh == nil {
		return
	}
	sh.close(s.logf)
	s.mu.Lock()
	if s.shells[ss] == sh {
		delete(s.shells, ss)
	}
	s.mu.Unlock()
}

// endShellOf ends the shell of the session whose id is id, if any.
func (s *Server) endShellOf(id string) {
	s.mu.Lock()
	var of *mcp.ServerSession
	for ss := range s.shells {
		if ss != nil && ss.ID() == id {
			of = ss
		}
	}
	s.mu.Unlock()
	if of != nil {
		s.endShell(of)
	}
}

// closeShells ends every shell, and those of later calls at once: Close.
// A shell that endShell is closing is waited for (its lock).
func (s *Server) closeShells() {
	s.mu.Lock()
	all := s.shells
	s.shells, s.shellsClosed = nil, true
	s.mu.Unlock()
	for _, sh := range all {
		sh.close(s.logf)
	}
}

func (sh *shell) close(logf func(string, ...any)) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.closed = true
	if sh.sb != nil {
		if err := sh.sb.Close(); err != nil {
			logf("ending live sandbox %s: %v", sh.sb.Info().ID, err)
		}
		sh.sb = nil
	}
}

// errShellEnded is the refusal of a call in a session whose shell ended.
var errShellEnded = errkind.New(errkind.Unavailable, "the server is stopping: no new sandbox")

// sandboxOf is sh's sandbox, its timeout set again from now; one made
// now if it has none or it ended, with a note saying so then.
func (s *Server) sandboxOf(ctx context.Context, sh *shell) (runapi.Sandbox, string, error) {
	s.mu.Lock()
	create, idle := s.newSandbox, s.sandboxIdle
	s.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.closed {
		return nil, "", errShellEnded
	}
	var note string
	if sh.sb != nil {
		// Set, or past its max lifetime: it ends at that.
		if _, err := sh.sb.SetTimeout(idle); errkind.Of(err) != errkind.NotFound {
			return sh.sb, "", nil
		}
		note = "the sandbox had ended (its lifetime or idle timeout passed): this is a new one, without the last one's files and processes"
		sh.sb, sh.seq = nil, map[int]int{}
	}
	sb, err := create(ctx)
	if err != nil {
		return nil, "", err
	}
	sh.sb = sb
	return sb, note, nil
}

// shellError is tool's answer to err: refused in the error's words when
// the model can act on it, else the host's failure, logged.
func (s *Server) shellError(tool string, err error) *mcp.CallToolResult {
	var ref *runapi.Refusal
	switch kind := errkind.Of(err); {
	case errors.As(err, &ref) && !hostKind(kind):
		return refused(tool, ref)
	case kind == errkind.NotFound:
		return errorResult(tool + " refused: the sandbox has ended; call exec_command again for a new one")
	case hostKind(kind):
		s.logf("%s: %v", tool, err)
		return hostFailure(tool, "")
	}
	return errorResult(tool + " refused: " + err.Error())
}
