package interp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/untrusted"
)

// ReplPath is agentrun's REPL launcher inside a live sandbox
// (internal/launcher's ReplPath, which a test holds to this).
const ReplPath = "/dev/agentrun-python/agentrun_repl.py"

// Bounds of a sandbox's code interpreter.
const (
	// MaxContexts bounds the contexts of one sandbox: each is an
	// interpreter living in it, within its limits.
	MaxContexts = 16
	// MaxResults bounds the results of one cell: its value and 16
	// displayed objects (spec §12); past it they are counted.
	MaxResults = 17
	// startTimeout bounds how long a context's interpreter may take to
	// say it is ready.
	startTimeout = 60 * time.Second
	// interruptGrace bounds how long an interrupted cell may take to
	// end once its client went: past it the context's interpreter is
	// killed (and started again at its next cell).
	interruptGrace = 10 * time.Second
	// keepalive is how often a cell that prints nothing sends a
	// keepalive message, as E2B's server does, so that a proxy on the
	// way keeps the stream and a client gone is seen.
	keepalive = 20 * time.Second
	// stderrTail bounds what of an interpreter's own stderr an error
	// names.
	stderrTail = 1024
)

// Languages: python has an interpreter; the others E2B knows are
// refused with a message the SDK shows.
const Python = "python"

// Interpreter is one live sandbox's code interpreter: its contexts, each
// an interpreter process kept alive in the sandbox (agentrun_repl.py,
// exec'd through runapi.Sandbox.Exec with its stdin open), and the
// default context of each language, made at its first need.
type Interpreter struct {
	sb runapi.Sandbox
	// argv runs the REPL launcher: the image's python3; bash a bash
	// context's shell.
	argv, bash []string
	// max bounds its contexts: MaxContexts.
	max int

	mu       sync.Mutex
	contexts map[string]*Context
	defaults map[string]*Context
	cell     int
	closed   bool
}

// New is sb's code interpreter, with no context yet.
func New(sb runapi.Sandbox) *Interpreter {
	return &Interpreter{sb: sb, argv: []string{"python3", ReplPath}, bash: bashArgv, max: MaxContexts,
		contexts: map[string]*Context{}, defaults: map[string]*Context{}}
}

// Context is a context: an interpreter, its language and working
// directory.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	in *Interpreter
	// mu is held by a cell while it runs, by a start and by a read.
	mu      sync.Mutex
	proc    runapi.Process
	seq     int
	split   Splitter
	stderr  []byte // the interpreter's own stderr, its tail
	removed bool
	// token and count are a bash context's: its cells' mark and how
	// many ran.
	token string
	count int
}

// errNotFound marks a context that is not the sandbox's.
var errNotFound = errkind.New(errkind.NotFound, "context not found")

// NormalizeLanguage reads a language as E2B's server does: none is
// python, js javascript, ts typescript.
func NormalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return Python
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	case "python3":
		return Python
	}
	return l
}

// checkLanguage refuses a language without an interpreter here.
func checkLanguage(l string) error {
	if l == Python || l == Bash {
		return nil
	}
	return errkind.Mark(errkind.NotFound, fmt.Errorf("no %s interpreter: agentrun's code interpreter runs python and bash contexts only", untrusted.Cut(untrusted.Text(l), 64)))
}

// Create makes a context of language in cwd ("" is /workspace) and
// starts its interpreter.
func (in *Interpreter) Create(ctx context.Context, language, cwd string) (*Context, error) {
	language = NormalizeLanguage(language)
	if err := checkLanguage(language); err != nil {
		return nil, err
	}
	c, err := in.add(language, cwd)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.startLocked(ctx); err != nil {
		in.remove(c)
		return nil, err
	}
	return c, nil
}

// add registers a new context, not yet started, within MaxContexts.
func (in *Interpreter) add(language, cwd string) (*Context, error) {
	if cwd == "" {
		cwd = "/workspace"
	}
	if strings.ContainsRune(cwd, 0) || len(cwd) > 4096 {
		return nil, errkind.Mark(errkind.Invalid, errors.New("cwd: not a path"))
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	c := &Context{ID: hex.EncodeToString(b[:]), Language: language, Cwd: cwd, in: in}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, errkind.New(errkind.NotFound, "the sandbox has ended")
	}
	if len(in.contexts) >= in.max {
		return nil, errkind.Mark(errkind.Quota, fmt.Errorf("the sandbox has %d contexts, the most it may have: remove one first", in.max))
	}
	in.contexts[c.ID] = c
	return c, nil
}

// remove forgets c (as a default too).
func (in *Interpreter) remove(c *Context) {
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.contexts, c.ID)
	for l, d := range in.defaults {
		if d == c {
			delete(in.defaults, l)
		}
	}
}

// Default is language's default context, made at its first need.
func (in *Interpreter) Default(ctx context.Context, language string) (*Context, error) {
	language = NormalizeLanguage(language)
	if err := checkLanguage(language); err != nil {
		return nil, err
	}
	in.mu.Lock()
	c := in.defaults[language]
	in.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := in.add(language, "")
	if err != nil {
		return nil, err
	}
	in.mu.Lock()
	if d := in.defaults[language]; d != nil {
		// Made by another request meanwhile.
		delete(in.contexts, c.ID)
		in.mu.Unlock()
		return d, nil
	}
	in.defaults[language] = c
	in.mu.Unlock()
	// Its interpreter starts at its first cell.
	return c, nil
}

// Get is the context id, errNotFound if it is none of the sandbox's.
func (in *Interpreter) Get(id string) (*Context, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if c := in.contexts[id]; c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("%w: %s", errNotFound, untrusted.Cut(untrusted.Text(id), 64))
}

// List is the sandbox's contexts.
func (in *Interpreter) List() []*Context {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]*Context, 0, len(in.contexts))
	for _, c := range in.contexts {
		out = append(out, c)
	}
	return out
}

// Restart kills the context's interpreter (a cell running ends with an
// error) and starts a new one: its state is gone.
func (in *Interpreter) Restart(ctx context.Context, id string) error {
	c, err := in.Get(id)
	if err != nil {
		return err
	}
	c.kill()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startLocked(ctx)
}

// Remove kills the context's interpreter and forgets it.
func (in *Interpreter) Remove(id string) error {
	c, err := in.Get(id)
	if err != nil {
		return err
	}
	in.remove(c)
	c.kill()
	c.mu.Lock()
	c.removed = true
	c.mu.Unlock()
	return nil
}

// Close kills every context's interpreter; no context is made after. It
// is an io.Closer, for what the door keeps of a sandbox.
func (in *Interpreter) Close() error {
	in.mu.Lock()
	in.closed = true
	cs := in.contexts
	in.contexts, in.defaults = map[string]*Context{}, map[string]*Context{}
	in.mu.Unlock()
	for _, c := range cs {
		c.kill()
	}
	return nil
}

// kill kills the context's interpreter, if it runs.
func (c *Context) kill() {
	c.in.mu.Lock()
	p := c.proc
	c.in.mu.Unlock()
	if p != nil {
		_ = p.Signal(syscall.SIGKILL)
	}
}

// startLocked starts the context's interpreter and waits for it to say it
// is ready; c.mu is held.
func (c *Context) startLocked(ctx context.Context) error {
	if c.proc != nil {
		_ = c.proc.Signal(syscall.SIGKILL)
		<-c.proc.Done()
	}
	c.setProc(nil)
	c.seq, c.split, c.stderr, c.count = 0, Splitter{}, nil, 0
	req := runapi.ExecRequest{Command: c.in.argv, Cwd: c.Cwd, Stdin: true,
		Env: map[string]string{"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}}
	if c.Language == Bash {
		req = runapi.ExecRequest{Command: c.in.bash, Cwd: c.Cwd, Stdin: true}
	}
	p, err := c.in.sb.Exec(req)
	if err != nil {
		// Most likely the image has no such program: the SDK shows a
		// 404's message.
		return errkind.Mark(errkind.NotFound, fmt.Errorf("starting the context's interpreter (%s, which the image must have): %w", req.Command[0], err))
	}
	c.setProc(p)
	if c.Language == Bash {
		if err := c.startBashLocked(ctx); err != nil {
			_ = p.Signal(syscall.SIGKILL)
			return fmt.Errorf("starting the context's shell: %w", err)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	ready := false
	for !ready {
		err := c.read(ctx, func(f *Frame) {
			if f.T == "ready" {
				ready = true
			}
		})
		if err != nil && !ready {
			_ = p.Signal(syscall.SIGKILL)
			return fmt.Errorf("starting the context's interpreter: %w", err)
		}
	}
	return nil
}

func (c *Context) setProc(p runapi.Process) {
	c.in.mu.Lock()
	c.proc = p
	c.in.mu.Unlock()
}

// errEnded is read's error once the interpreter ended.
type errEnded struct{ msg string }

func (e *errEnded) Error() string { return e.msg }

// read takes the interpreter's output that came since the last read,
// waiting for some until ctx ends, and calls frame with each frame it
// completes; it returns ctx's error when it ended, an *errEnded once the
// interpreter ended. A line that is not a frame is dropped. c.mu is held.
func (c *Context) read(ctx context.Context, frame func(*Frame)) error {
	evs, next, _ := c.proc.Next(ctx, c.seq)
	if next-len(evs) > c.seq {
		c.split.Resync() // output dropped: the line read so far is cut
	}
	c.seq = next
	for _, ev := range evs {
		switch ev.Event {
		case "stdout":
			data, err := ev.Output()
			if err != nil {
				continue
			}
			c.split.Write(data, func(line []byte) {
				if f, err := ParseFrame(line); err == nil {
					frame(f)
				}
			})
		case "stderr":
			data, _ := ev.Output()
			c.stderr = append(c.stderr, data...)
			if len(c.stderr) > stderrTail {
				c.stderr = append([]byte(nil), c.stderr[len(c.stderr)-stderrTail:]...)
			}
		case "exit":
			return &errEnded{msg: c.endMessage(ev)}
		}
	}
	if len(evs) == 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		if ex := c.proc.Exit(); ex != nil {
			return &errEnded{msg: c.endMessage(*ex)}
		}
	}
	return nil
}

// endMessage says how the interpreter ended, with the tail of its own
// stderr, escaped.
func (c *Context) endMessage(ev runapi.ProcessEvent) string {
	how := "ended"
	switch {
	case ev.Signal != "":
		how = "was killed by " + ev.Signal
	case ev.ExitCode != nil:
		how = fmt.Sprintf("exited with status %d", *ev.ExitCode)
	}
	msg := "the context's interpreter " + how
	if tail := strings.TrimSpace(string(c.stderr)); tail != "" {
		msg += ": " + untrusted.Cut(untrusted.Text(tail), stderrTail)
	}
	return msg
}

// Request is a cell to run.
type Request struct {
	Code string
	Env  map[string]string
}

// Execute runs req in the context, calling emit with each message of
// E2B's stream as it comes (stdout, stderr, result, error,
// number_of_executions, keepalive); the caller ends the stream with
// end_of_execution. A context whose interpreter ended starts a new one
// first (its state is gone, as a Jupyter kernel's that restarted). Once
// ctx ends, or emit fails (the client went), the cell is interrupted
// (SIGINT) and, if it does not end within a grace, the interpreter is
// killed. It returns an error only where the cell could not be sent.
func (c *Context) Execute(ctx context.Context, req Request, emit func(any) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removed {
		return errNotFound
	}
	if err := ctx.Err(); err != nil {
		return err // the client went while another cell ran
	}
	if c.proc == nil || c.proc.Exit() != nil {
		if err := c.startLocked(ctx); err != nil {
			return err
		}
	}
	c.in.mu.Lock()
	c.in.cell++
	cell := c.in.cell
	c.in.mu.Unlock()
	if c.Language == Bash {
		return c.executeBash(ctx, cell, req, func(v any) { _ = emit(v) })
	}
	line, err := json.Marshal(map[string]any{"cell": cell, "code": req.Code, "env": req.Env})
	if err != nil {
		return err
	}
	if err := c.proc.WriteStdin(append(line, '\n'), false); err != nil {
		return fmt.Errorf("sending the cell to the context's interpreter: %w", err)
	}
	var (
		done    bool
		gone    error // the client's end: ctx's or emit's error
		results int
		dropped int
	)
	send := func(v any) {
		if gone == nil {
			if err := emit(v); err != nil {
				gone = err
			}
		}
	}
	handle := func(f *Frame) {
		if f.Cell != cell || done {
			return
		}
		switch f.T {
		case "stdout", "stderr":
			send(map[string]any{"type": f.T, "text": f.Text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
		case "result":
			if results >= MaxResults {
				dropped++
				return
			}
			results++
			send(Result(f.Main, f.Bundle))
		case "error":
			send(map[string]any{"type": "error", "name": f.Name, "value": f.Value, "traceback": f.Traceback})
		case "done":
			if dropped > 0 {
				send(map[string]any{"type": "stderr", "text": fmt.Sprintf("agentrun: %d results of this cell dropped: at most %d are shown\n", dropped, MaxResults)})
			}
			send(map[string]any{"type": "number_of_executions", "execution_count": f.Count})
			done = true
		}
	}
	interrupted := false
	var grace <-chan time.Time
	for !done {
		if gone == nil && ctx.Err() != nil {
			gone = ctx.Err()
		}
		if gone != nil && !interrupted {
			interrupted = true
			_ = c.proc.Signal(syscall.SIGINT)
			grace = time.After(interruptGrace)
		}
		var wait context.Context
		var cancel context.CancelFunc
		if interrupted {
			wait, cancel = context.WithCancel(context.Background())
			go func() {
				select {
				case <-grace:
				case <-wait.Done():
				}
				cancel()
			}()
		} else {
			wait, cancel = context.WithTimeout(ctx, keepalive)
		}
		err := c.read(wait, handle)
		cancel()
		var ended *errEnded
		switch {
		case errors.As(err, &ended):
			send(map[string]any{"type": "error", "name": "ContextEnded", "value": ended.msg + "; its next cell starts a new one", "traceback": ""})
			return nil
		case err != nil && interrupted:
			if !done {
				// The cell did not end within the grace: its
				// interpreter goes, and the next cell starts a new one.
				_ = c.proc.Signal(syscall.SIGKILL)
				<-c.proc.Done()
			}
			return nil
		case err != nil && ctx.Err() == nil && !done:
			send(map[string]any{"type": "keepalive"})
		}
	}
	return nil
}

// e2bFields are the result fields of E2B's messages, by MIME type.
var e2bFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
}

// Result is a result message of E2B's stream made of a MIME bundle: the
// formats E2B names (text without the quotes of a string's repr, as its
// server strips them; json as the JSON it holds, if it is JSON with no
// key twice), others left out.
func Result(main bool, bundle map[string]string) map[string]any {
	m := map[string]any{"type": "result", "is_main_result": main}
	for mime, v := range bundle {
		field, ok := e2bFields[mime]
		if !ok {
			continue
		}
		switch field {
		case "text":
			if len(v) >= 2 && (v[0] == '\'' && v[len(v)-1] == '\'' || v[0] == '"' && v[len(v)-1] == '"') {
				v = v[1 : len(v)-1]
			}
		case "json":
			if !json.Valid([]byte(v)) || jsonCheck(v) != nil {
				continue
			}
			m[field] = json.RawMessage(v)
			continue
		}
		m[field] = v
	}
	return m
}
