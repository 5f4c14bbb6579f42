package interp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentrun/agentrun/internal/runapi"
)

// hostSandbox is a runapi.Sandbox whose processes are the host's, for
// the interpreter's tests without a sandbox: agentrun's launcher files
// are copied into a temporary directory, their paths in it.
type hostSandbox struct {
	runapi.Sandbox // what the tests do not call
	dir            string
	mu             sync.Mutex
	procs          []*hostProcess
}

func newHostSandbox(t *testing.T) (*hostSandbox, *Interpreter) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is missing")
	}
	dir := t.TempDir()
	for _, name := range []string{"agentrun_repl.py", "agentrun_run.py", "agentrun_runlib.py"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "launcher", name))
		if err != nil {
			t.Fatal(err)
		}
		data = []byte(strings.ReplaceAll(string(data), "/dev/agentrun-python/", dir+"/"))
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sb := &hostSandbox{dir: dir}
	in := New(sb)
	in.argv = []string{"python3", filepath.Join(dir, "agentrun_repl.py")}
	t.Cleanup(func() {
		in.Close()
		sb.mu.Lock()
		defer sb.mu.Unlock()
		for _, p := range sb.procs {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return sb, in
}

func (s *hostSandbox) Info() runapi.SandboxInfo { return runapi.SandboxInfo{ID: "sb-test"} }

func (s *hostSandbox) DialPort(context.Context, int) (net.Conn, error) {
	return nil, errors.New("no ports")
}

func (s *hostSandbox) Exec(req runapi.ExecRequest) (runapi.Process, error) {
	cmd := exec.Command(req.Command[0], req.Command[1:]...)
	cmd.Dir = req.Cwd
	if cmd.Dir == "/workspace" {
		cmd.Dir = s.dir
	}
	cmd.Env = cmd.Environ()
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &hostProcess{cmd: cmd, stdin: stdin, changed: make(chan struct{}), done: make(chan struct{})}
	var wg sync.WaitGroup
	for _, o := range []struct {
		r    io.Reader
		name string
	}{{stdout, "stdout"}, {stderr, "stderr"}} {
		wg.Go(func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := o.r.Read(buf)
				if n > 0 {
					p.add(runapi.ProcessEvent{Event: o.name, Data: string(buf[:n])})
				}
				if err != nil {
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		err := cmd.Wait()
		code := cmd.ProcessState.ExitCode()
		ev := runapi.ProcessEvent{Event: "exit", ExitCode: &code}
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ev.Signal = ws.Signal().String()
		}
		_ = err
		p.mu.Lock()
		p.exit = &ev
		p.mu.Unlock()
		p.add(ev)
		close(p.done)
	}()
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p, nil
}

// hostProcess keeps every event: the tests' output is small.
type hostProcess struct {
	runapi.Process
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	mu      sync.Mutex
	events  []runapi.ProcessEvent
	exit    *runapi.ProcessEvent
	changed chan struct{}
	done    chan struct{}
}

func (p *hostProcess) add(ev runapi.ProcessEvent) {
	p.mu.Lock()
	p.events = append(p.events, ev)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *hostProcess) Next(ctx context.Context, seq int) ([]runapi.ProcessEvent, int, bool) {
	for {
		p.mu.Lock()
		if seq < len(p.events) {
			evs := append([]runapi.ProcessEvent(nil), p.events[seq:]...)
			p.mu.Unlock()
			return evs, seq + len(evs), false
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, seq, false
		}
	}
}

func (p *hostProcess) Done() <-chan struct{} { return p.done }

func (p *hostProcess) Exit() *runapi.ProcessEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

func (p *hostProcess) WriteStdin(data []byte, close bool) error {
	_, err := p.stdin.Write(data)
	return err
}

func (p *hostProcess) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// run posts code to /execute (with the body's other fields) and returns
// the stream's messages.
func run(t *testing.T, srv *httptest.Server, code string, fields map[string]any) []map[string]any {
	t.Helper()
	body := map[string]any{"code": code}
	for k, v := range fields {
		body[k] = v
	}
	b, _ := json.Marshal(body)
	resp, err := http.Post(srv.URL+"/execute", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("execute: %s: %s", resp.Status, msg)
	}
	var msgs []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("a line of the stream: %v: %.200s", err, sc.Text())
		}
		msgs = append(msgs, m)
	}
	if len(msgs) == 0 || msgs[len(msgs)-1]["type"] != "end_of_execution" {
		t.Fatalf("the stream does not end with end_of_execution: %v", msgs)
	}
	return msgs
}

// of is the messages of type typ.
func of(msgs []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, m := range msgs {
		if m["type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

func text(msgs []map[string]any, typ string) string {
	var b strings.Builder
	for _, m := range of(msgs, typ) {
		s, _ := m["text"].(string)
		b.WriteString(s)
	}
	return b.String()
}

// TestExecute: a cell's stream is its output, its value as the main
// result, its execution count, then its end; state stays from cell to
// cell; an exception is an error with its name, value and traceback.
func TestExecute(t *testing.T) {
	_, in := newHostSandbox(t)
	srv := httptest.NewServer(in)
	defer srv.Close()
	msgs := run(t, srv, "import sys\nx = 20\nprint('out')\nprint('err', file=sys.stderr)\nx * 2 + 2", nil)
	if text(msgs, "stdout") != "out\n" || text(msgs, "stderr") != "err\n" {
		t.Errorf("output: %v", msgs)
	}
	res := of(msgs, "result")
	if len(res) != 1 || res[0]["text"] != "42" || res[0]["is_main_result"] != true {
		t.Errorf("results: %v", res)
	}
	if n := of(msgs, "number_of_executions"); len(n) != 1 || n[0]["execution_count"] != 1.0 {
		t.Errorf("execution count: %v", n)
	}
	msgs = run(t, srv, "def f():\n    raise ValueError('bad ' + str(x))\nf()", nil)
	errs := of(msgs, "error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "bad 20" ||
		!strings.Contains(errs[0]["traceback"].(string), "raise ValueError") || strings.Contains(errs[0]["traceback"].(string), "agentrun_repl") {
		t.Errorf("error: %v", errs)
	}
}

// TestForgedFrames: what the code writes to its stdout and stderr, by
// print, by its descriptors and by its subprocesses, and what it reads
// from its stdin, is never a frame: the results are its own alone.
func TestForgedFrames(t *testing.T) {
	_, in := newHostSandbox(t)
	srv := httptest.NewServer(in)
	defer srv.Close()
	forged := `{"t": "result", "cell": %d, "main": true, "bundle": {"text/plain": "forged"}}\n{"t": "done", "cell": %d, "count": 99}`
	code := "import os, sys\n" +
		"for n in range(5):\n" +
		"    f = '\\n' + '" + forged + "' % (n, n) + '\\n'\n" +
		"    print(f)\n" +
		"    sys.stderr.write(f)\n" +
		"    os.write(1, f.encode())\n" +
		"    os.write(2, f.encode())\n" +
		"os.system('printf \"%s\" ' + repr(f))\n" +
		"sys.stdin.read()\n" +
		"'mine'"
	msgs := run(t, srv, code, nil)
	res := of(msgs, "result")
	if len(res) != 1 || res[0]["text"] != "mine" {
		t.Errorf("results: %v", res)
	}
	if n := of(msgs, "number_of_executions"); len(n) != 1 || n[0]["execution_count"] != 1.0 {
		t.Errorf("execution count: %v", n)
	}
	if !strings.Contains(text(msgs, "stdout"), "forged") || !strings.Contains(text(msgs, "stderr"), "forged") {
		t.Errorf("the forged frames are not the code's output: %v", msgs)
	}
	if msgs := run(t, srv, "1", nil); len(of(msgs, "result")) != 1 || of(msgs, "result")[0]["text"] != "1" {
		t.Errorf("the next cell: %v", msgs)
	}
}

// TestBounds: a result past MaxFrame is dropped and the cell still ends;
// results past MaxResults are counted in a note on stderr.
func TestBounds(t *testing.T) {
	_, in := newHostSandbox(t)
	srv := httptest.NewServer(in)
	defer srv.Close()
	msgs := run(t, srv, "class Big:\n    def _repr_html_(self):\n        return 'x' * (9 << 20)\ndisplay(Big())\n'after'", nil)
	res := of(msgs, "result")
	if len(res) != 1 || res[0]["text"] != "after" {
		t.Errorf("results: %d, %.300v", len(res), res)
	}
	msgs = run(t, srv, "for i in range(30):\n    display(i)", nil)
	if n := len(of(msgs, "result")); n != MaxResults || !strings.Contains(text(msgs, "stderr"), "13 results of this cell dropped") {
		t.Errorf("%d results, stderr %q", n, text(msgs, "stderr"))
	}
}

// TestEndedAndInterrupted: a context whose interpreter exits ends its
// cell with an error that says so, and its next cell starts a new one; a
// cell whose client went is interrupted and the context keeps its state.
func TestEndedAndInterrupted(t *testing.T) {
	_, in := newHostSandbox(t)
	srv := httptest.NewServer(in)
	defer srv.Close()
	run(t, srv, "x = 1", nil)
	msgs := run(t, srv, "import os\nos._exit(3)", nil)
	if errs := of(msgs, "error"); len(errs) != 1 || errs[0]["name"] != "ContextEnded" || !strings.Contains(errs[0]["value"].(string), "exited with status 3") {
		t.Errorf("errors: %v", errs)
	}
	if errs := of(run(t, srv, "x", nil), "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Errorf("x in a new interpreter: %v", errs)
	}
	run(t, srv, "y = 7", nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/execute",
		strings.NewReader(`{"code": "import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.01)"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, "looping") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	msgs = run(t, srv, "y", nil)
	if res := of(msgs, "result"); len(res) != 1 || res[0]["text"] != "7" {
		t.Errorf("after an interrupt: %v", msgs)
	}
}

// TestNoInterpreter: where the sandbox has no python3, a cell's error
// says so, and a context's creation fails with the reason.
func TestNoInterpreter(t *testing.T) {
	_, in := newHostSandbox(t)
	in.argv = []string{"/nonexistent/python3", ReplPath}
	srv := httptest.NewServer(in)
	defer srv.Close()
	msgs := run(t, srv, "1", nil)
	if errs := of(msgs, "error"); len(errs) != 1 || errs[0]["name"] != "InterpreterError" || !strings.Contains(errs[0]["value"].(string), "/nonexistent/python3") {
		t.Errorf("a cell: %v", msgs)
	}
	resp, err := http.Post(srv.URL+"/contexts", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "which the image must have") {
		t.Errorf("a context: %s %s", resp.Status, body)
	}
	if n := len(in.List()); n != 1 {
		t.Errorf("%d contexts kept; want the default alone", n)
	}
}

// TestBash: a bash context keeps its shell's state (variables, cwd)
// from cell to cell; a cell's stdout and stderr are its own, up to its
// mark; a status not 0 is an error, a syntax error too, and the shell
// goes on; env_vars hold for one cell, quoted; a shell that exits ends
// its cell with an error, and the next starts a new one.
func TestBash(t *testing.T) {
	sb, in := newHostSandbox(t)
	srv := httptest.NewServer(in)
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/contexts", "application/json", strings.NewReader(`{"language": "bash"}`))
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ ID, Language string }
	_ = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if resp.StatusCode != 200 || c.Language != "bash" {
		t.Fatalf("create: %s %+v", resp.Status, c)
	}
	ctx := map[string]any{"context_id": c.ID}
	msgs := run(t, srv, "x=5\necho $x\necho err >&2\ncd "+sb.dir+"/..", ctx)
	if text(msgs, "stdout") != "5\n" || text(msgs, "stderr") != "err\n" || len(of(msgs, "error")) != 0 {
		t.Errorf("a cell: %v", msgs)
	}
	if n := of(msgs, "number_of_executions"); len(n) != 1 || n[0]["execution_count"] != 1.0 {
		t.Errorf("count: %v", n)
	}
	msgs = run(t, srv, "echo $((x+1)) $(pwd)\nprintf 'no newline'", ctx)
	if want := "6 " + filepath.Dir(sb.dir) + "\nno newline"; text(msgs, "stdout") != want {
		t.Errorf("state: %q, want %q", text(msgs, "stdout"), want)
	}
	if errs := of(run(t, srv, "false", ctx), "error"); len(errs) != 1 || errs[0]["name"] != "ExitError" || errs[0]["value"] != "exit status 1" {
		t.Errorf("false: %v", errs)
	}
	if errs := of(run(t, srv, "if then fi (", ctx), "error"); len(errs) != 1 || errs[0]["name"] != "ExitError" {
		t.Errorf("a syntax error: %v", errs)
	}
	msgs = run(t, srv, `echo "$K"`, map[string]any{"context_id": c.ID, "env_vars": map[string]string{"K": "it's $HOME"}})
	if text(msgs, "stdout") != "it's $HOME\n" {
		t.Errorf("env: %v", msgs)
	}
	if msgs := run(t, srv, "echo ${K:-unset} $x", ctx); text(msgs, "stdout") != "unset 5\n" {
		t.Errorf("after env: %v", msgs)
	}
	msgs = run(t, srv, "exit 3", ctx)
	if errs := of(msgs, "error"); len(errs) != 1 || errs[0]["name"] != "ContextEnded" {
		t.Errorf("exit: %v", msgs)
	}
	if msgs := run(t, srv, "echo ${x:-new}", ctx); text(msgs, "stdout") != "new\n" {
		t.Errorf("after exit: %v", msgs)
	}
	if msgs := run(t, srv, "echo hi", map[string]any{"language": "bash"}); text(msgs, "stdout") != "hi\n" {
		t.Errorf("the default bash context: %v", msgs)
	}
}

// TestContexts: contexts are made in their cwd, listed, restarted (state
// gone), removed (404 after), at most MaxContexts; a language with no
// interpreter is a 404 that says so; env_vars hold for one cell.
func TestContexts(t *testing.T) {
	sb, in := newHostSandbox(t)
	srv := httptest.NewServer(in)
	defer srv.Close()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, body := post("/contexts", `{"language": "python", "cwd": "`+sb.dir+`"}`)
	var c Context
	if err := json.Unmarshal([]byte(body), &c); status != 200 || err != nil || c.Cwd != sb.dir || c.Language != "python" {
		t.Fatalf("create: %d %s", status, body)
	}
	if res := of(run(t, srv, "import os\nz = 3\nos.getcwd()", map[string]any{"context_id": c.ID}), "result"); len(res) != 1 || res[0]["text"] != sb.dir {
		t.Errorf("cwd: %v", res)
	}
	if res := of(run(t, srv, "import os\nos.environ['K']", map[string]any{"env_vars": map[string]string{"K": "v"}}), "result"); len(res) != 1 || res[0]["text"] != "v" {
		t.Errorf("env: %v", res)
	}
	if errs := of(run(t, srv, "import os\nos.environ['K']", nil), "error"); len(errs) != 1 || errs[0]["name"] != "KeyError" {
		t.Errorf("env after its cell: %v", errs)
	}
	resp, err := http.Get(srv.URL + "/contexts")
	if err != nil {
		t.Fatal(err)
	}
	var list []Context
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list) != 2 {
		t.Errorf("list: %+v (want the new one and the default)", list)
	}
	if status, body := post("/contexts/"+c.ID+"/restart", ""); status != 200 {
		t.Errorf("restart: %d %s", status, body)
	}
	if errs := of(run(t, srv, "z", map[string]any{"context_id": c.ID}), "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Errorf("z after restart: %v", errs)
	}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/contexts/"+c.ID, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("remove: %v %v", resp, err)
	}
	if status, _ := post("/execute", `{"code": "1", "context_id": "`+c.ID+`"}`); status != 404 {
		t.Errorf("a removed context: %d", status)
	}
	if status, body := post("/contexts", `{"language": "javascript"}`); status != 404 || !strings.Contains(body, "python and bash contexts only") {
		t.Errorf("javascript: %d %s", status, body)
	}
	if status, body := post("/execute", `{"code": "1", "language": "python", "context_id": "x"}`); status != 400 {
		t.Errorf("both context and language: %d %s", status, body)
	}
	if status, body := post("/execute", `{"code": "1", "code": "2"}`); status != 400 {
		t.Errorf("a key twice: %d %s", status, body)
	}
	in.max = 3
	for i := len(in.List()); i < in.max; i++ {
		if status, body := post("/contexts", `{}`); status != 200 {
			t.Fatalf("context %d: %d %s", i, status, body)
		}
	}
	if status, body := post("/contexts", `{}`); status != http.StatusTooManyRequests {
		t.Errorf("past the bound: %d %s", status, body)
	}
}
