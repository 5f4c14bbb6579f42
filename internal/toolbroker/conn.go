package toolbroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/internal/secret"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/cgroup"
)

// Bounds of a stdio server's process and of an HTTP server's client.
const (
	// ServerPids and ServerMemory bound a stdio server's cgroup.
	ServerPids   = 64
	ServerMemory = 512 << 20
	// stderrTail is how much of a stdio server's stderr is kept, for the
	// host's log when it fails.
	stderrTail = 2 << 10
	// exitWait is how long Close waits for a stdio server to exit once its
	// stdin is closed, before killing it.
	exitWait = 2 * time.Second
	// frameSlack is what a frame may hold beyond a result's bound (the
	// JSON-RPC envelope), and the list's.
	frameSlack = 64 << 10
	// httpConns bounds the connections to one HTTP server.
	httpConns = 8
)

// errTooLarge is a frame or response of a server past its bound.
var errTooLarge = errors.New("the tool server's answer is past the broker's bound")

// conn is the connection to one server: made at first use, under its
// lock, once; a failure is kept as the answer of every later use.
type conn struct {
	srv     Server
	cgPath  string // "" makes no cgroup
	lockDir string // of the cgroup-parent lock; "" none (Options.CgroupLockDir)
	limit   int64  // the most bytes of one frame or response
	logf    func(string, ...any)
	// tooLarge counts the answers cut at limit.
	tooLarge atomic.Uint64

	mu      sync.Mutex
	started bool
	err     error
	cs      *mcp.ClientSession
	proc    *process
	client  *http.Client // an HTTP server's
	dead    atomic.Bool  // the session ended
}

func newConn(s Server, cgPath, lockDir string, l Limits, logf func(string, ...any)) *conn {
	return &conn{srv: s, cgPath: cgPath, lockDir: lockDir, limit: max(l.ResultBytes, MaxListBytes) + frameSlack, logf: logf}
}

// cgroupPath is the cgroup of run's server name under parent ("" none).
func cgroupPath(parent, run, name string) string {
	if parent == "" {
		return ""
	}
	clean := strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return r
		}
		return '_'
	}, run)
	return parent + "/tool-" + clean + "-" + name
}

// fail makes c's every use fail with err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	c.started, c.err = true, err
	c.mu.Unlock()
}

// failed reports whether c failed to start or its session ended.
func (c *conn) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started && c.err != nil || c.dead.Load()
}

// session is c's MCP session, connecting (starting a stdio server) at
// the first use within ctx.
func (c *conn) session(ctx context.Context) (*mcp.ClientSession, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		c.started = true
		c.cs, c.err = c.connect(ctx)
		if c.err != nil {
			c.logf("toolbroker: tool server %s: %v", c.srv.Name, c.err)
		} else {
			cs := c.cs
			go func() { cs.Wait(); c.dead.Store(true) }()
		}
	}
	return c.cs, c.err
}

// connect starts the stdio server or reaches the HTTP one, and makes the
// MCP session (the initialize handshake) within ctx.
func (c *conn) connect(ctx context.Context) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "agentrun", Version: "1"}, nil)
	var t mcp.Transport
	if c.srv.URL != "" {
		c.client = c.httpClient()
		t = &mcp.StreamableClientTransport{Endpoint: c.srv.URL, HTTPClient: c.client, MaxRetries: -1,
			DisableStandaloneSSE: true, MaxEventSize: int(c.limit)}
	} else {
		p, err := startProcess(c.srv, c.cgPath, c.lockDir, c.limit, &c.tooLarge)
		if err != nil {
			return nil, fmt.Errorf("tool server %s failed to start: %w", c.srv.Name, err)
		}
		c.proc = p
		t = &mcp.IOTransport{Reader: p.stdout, Writer: p.stdin, MaxLineLength: -1} // p.stdout bounds each line
	}
	cs, err := client.Connect(ctx, t, nil)
	if err != nil {
		if c.proc != nil {
			c.proc.stop(c.logf)
			c.logf("toolbroker: tool server %s: stderr: %s", c.srv.Name, c.proc.stderrTail())
			c.proc = nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tool server %s failed to start: no answer to MCP's initialize in time", c.srv.Name)
		}
		return nil, fmt.Errorf("tool server %s failed to start: %w", c.srv.Name, cut(err))
	}
	return cs, nil
}

// close ends c's session and stops its process.
func (c *conn) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = true
	if c.err == nil {
		c.err = errors.New("the tool server is stopped")
	}
	var err error
	if c.cs != nil {
		done := make(chan struct{})
		go func() { c.cs.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(exitWait):
		}
		c.cs = nil
	}
	if c.proc != nil {
		err = c.proc.stop(c.logf)
		c.proc = nil
	}
	if c.client != nil {
		c.client.CloseIdleConnections()
	}
	return err
}

// httpClient is the client of an HTTP server: bounded in time,
// connections and the bytes of each response, adding the config's
// headers to every request.
func (c *conn) httpClient() *http.Client {
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		TLSHandshakeTimeout:    10 * time.Second,
		ResponseHeaderTimeout:  0, // a call's own timeout bounds the wait for its answer
		IdleConnTimeout:        90 * time.Second,
		MaxConnsPerHost:        httpConns,
		MaxIdleConnsPerHost:    httpConns,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{Transport: &headerTransport{next: tr, headers: c.srv, limit: c.limit, tooLarge: &c.tooLarge},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// headerTransport adds a server's headers, each read from its file at
// each request, and bounds each response's body.
type headerTransport struct {
	next     http.RoundTripper
	headers  Server
	limit    int64
	tooLarge *atomic.Uint64
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for _, h := range t.headers.Headers {
		v, err := secret.Read(h.File)
		if err != nil {
			return nil, fmt.Errorf("header %s of tool server %s: %w", h.Header, t.headers.Name, err)
		}
		req.Header.Set(h.Header, h.Prefix+v)
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &limitBody{rc: resp.Body, left: t.limit, tooLarge: t.tooLarge}
	return resp, nil
}

// limitBody fails a read past its bound with errTooLarge.
type limitBody struct {
	rc       io.ReadCloser
	left     int64
	tooLarge *atomic.Uint64
}

func (l *limitBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		l.tooLarge.Add(1)
		return 0, errTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.rc.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitBody) Close() error { return l.rc.Close() }

// process is a stdio server's process: its pipes, its cgroup (nil
// without one), the tail of its stderr and the secrets of its
// environment (kept out of the log).
type process struct {
	cmd     *exec.Cmd
	cg      *cgroup.Cgroup
	stdin   io.WriteCloser
	stdout  io.ReadCloser
	stderr  *tail
	secrets []string
	done    chan struct{} // closed when the process has been waited for
	lockDir string        // of the cgroup-parent lock; "" none
}

// startProcess starts s's command as s's user, in a process group and,
// with cgPath, a cgroup of its own, with s's environment alone.
func startProcess(s Server, cgPath, lockDir string, limit int64, tooLarge *atomic.Uint64) (*process, error) {
	env, secrets, err := environment(s)
	if err != nil {
		return nil, err
	}
	cred, err := credential(s)
	if err != nil {
		return nil, err
	}
	p := &process{stderr: &tail{}, secrets: secrets, done: make(chan struct{}), lockDir: lockDir}
	cmd := exec.Command(s.Command[0], s.Command[1:]...)
	cmd.Env, cmd.Dir, cmd.Stderr, cmd.WaitDelay = env, "/", p.stderr, exitWait
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
	if cgPath != "" && lockDir != "" {
		// The cgroup is made and joined while its parent cannot be
		// removed by another server's end.
		unlock, err := state.LockCgroupParent(lockDir, false)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	if cgPath != "" {
		limit := int64(ServerMemory)
		pids := int64(ServerPids)
		if p.cg, err = cgroup.New(cgPath, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit, Swap: &limit}, Pids: &specs.LinuxPids{Limit: &pids}}); err != nil {
			return nil, err
		}
		if cgroup.Unified() {
			dir, err := p.cg.OpenDir()
			if err != nil {
				p.removeCgroup()
				return nil, err
			}
			defer dir.Close()
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
		}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		p.removeCgroup()
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		p.removeCgroup()
		return nil, err
	}
	cmd.Stdin, cmd.Stdout = inR, outW
	err = startFromForkThread(cmd)
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		p.removeCgroup()
		return nil, fmt.Errorf("starting %s: %w", s.Command[0], err)
	}
	p.cmd, p.stdin, p.stdout = cmd, inW, &lineLimit{rc: outR, limit: limit, tooLarge: tooLarge}
	go func() { cmd.Wait(); close(p.done) }()
	// On cgroup v1 the process joins its cgroup just after it started:
	// what it forks before that is in its process group, killed too.
	if p.cg != nil && !cgroup.Unified() {
		if err := p.cg.Join(cmd.Process.Pid); err != nil {
			p.stop(func(string, ...any) {})
			return nil, err
		}
	}
	return p, nil
}

// environment is s's whole environment, the files' secrets read now, and
// the secrets read.
func environment(s Server) (env, secrets []string, err error) {
	for _, e := range s.Env {
		v := e.Value
		if e.File != "" {
			sec, err := secret.Read(e.File)
			if err != nil {
				return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			v = e.Prefix + sec
			secrets = append(secrets, sec)
		}
		env = append(env, e.Name+"="+v)
	}
	return env, secrets, nil
}

// credential is s's user: never root. Without root agentrun can only run
// a server as its own user (then it sets none).
func credential(s Server) (*syscall.Credential, error) {
	if s.UID == 0 || s.GID == 0 {
		return nil, errors.New("a tool server never runs as root (uid or gid 0)")
	}
	if os.Geteuid() != 0 {
		if int(s.UID) != os.Geteuid() || int(s.GID) != os.Getegid() {
			return nil, fmt.Errorf("cannot run as %d:%d: agentrun is not root", s.UID, s.GID)
		}
		return nil, nil
	}
	return &syscall.Credential{Uid: s.UID, Gid: s.GID, Groups: []uint32{}}, nil
}

// stop closes the server's stdin, waits up to exitWait for it to exit,
// then kills its process group and every process of its cgroup, and
// removes the cgroup.
func (p *process) stop(logf func(string, ...any)) error {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(exitWait):
	}
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGKILL)
	var errs []error
	if p.cg != nil {
		if err := p.cg.Kill(); err != nil {
			errs = append(errs, err)
		}
	}
	select {
	case <-p.done:
	case <-time.After(killWait):
		errs = append(errs, fmt.Errorf("tool server process %d not gone %s after SIGKILL", pgid, killWait))
	}
	p.stdout.Close()
	if p.cg != nil {
		if err := p.removeCgroup(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killWait bounds the wait for a killed server to be reaped.
const killWait = 5 * time.Second

// removeCgroup removes p's cgroup and, once empty and unless a server is
// being started right now, its parent.
func (p *process) removeCgroup() error {
	if p.cg == nil {
		return nil
	}
	err := p.cg.Remove()
	if p.lockDir == "" {
		return err
	}
	if unlock, lerr := state.LockCgroupParent(p.lockDir, true); lerr == nil {
		p.cg.RemoveParent() // fails while another server's cgroup is in it
		unlock()
	}
	return err
}

// stderrTail is the end of the server's stderr, its secrets replaced.
func (p *process) stderrTail() string {
	s := p.stderr.String()
	for _, sec := range p.secrets {
		s = strings.ReplaceAll(s, sec, "[secret]")
	}
	return fmt.Sprintf("%q", s)
}

// tail keeps the last stderrTail bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > stderrTail {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-stderrTail:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// lineLimit fails a read once a line (one JSON-RPC frame of a stdio
// server) passes limit bytes.
type lineLimit struct {
	rc       io.ReadCloser
	limit    int64
	line     int64
	tooLarge *atomic.Uint64
}

func (l *lineLimit) Read(p []byte) (int, error) {
	if l.line >= l.limit {
		l.tooLarge.Add(1)
		return 0, errTooLarge
	}
	if int64(len(p)) > l.limit-l.line {
		p = p[:l.limit-l.line]
	}
	n, err := l.rc.Read(p)
	for _, c := range p[:n] {
		if c == '\n' {
			l.line = 0
		} else {
			l.line++
		}
	}
	return n, err
}

func (l *lineLimit) Close() error { return l.rc.Close() }

// forks are the starts the fork thread makes, in turn.
var (
	forks    = make(chan func())
	forkOnce sync.Once
)

// startFromForkThread starts cmd from one OS thread kept for it that never
// exits. A stdio server's Pdeathsig fires when the thread that forked it
// ends, not the process: the Go runtime ends a thread whenever a goroutine
// locked to it returns (as a namespace switch that cannot be undone
// does), which would kill a server forked from it in the middle of its
// run. From this thread, it is killed only when agentrun dies.
func startFromForkThread(cmd *exec.Cmd) error {
	forkOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked, and the goroutine never returns
			for f := range forks {
				f()
			}
		}()
	})
	done := make(chan error, 1)
	forks <- func() { done <- cmd.Start() }
	return <-done
}
