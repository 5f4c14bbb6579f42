package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/backend"
)

// Holder is the program that holds a live sandbox up: the image's own
// shell, sleeping in a loop, never a helper of agentrun's.
var Holder = []string{"/bin/sh", "-c", "while :; do sleep 3600; done"}

// Options bound a sandbox.
type Options struct {
	// Lifetime is its time to live from creation; MaxLifetime bounds it
	// and every SetTimeout, counted from creation.
	Lifetime, MaxLifetime time.Duration
	// OutputBytes caps the output kept per process (its stdout and
	// stderr together); past it the oldest goes, counted.
	OutputBytes int64
}

// Defaults of Options' zero fields.
const (
	DefaultLifetime    = 5 * time.Minute
	DefaultMaxLifetime = time.Hour
	DefaultOutputBytes = 1 << 20
)

// maxProcesses bounds the processes a sandbox lists: the running ones
// (which its pids limit bounds too) and the latest ended.
const maxProcesses = 256

// Sandbox is one live sandbox.
type Sandbox struct {
	// ID is its capability: "sb-" and 128 random bits in hex.
	ID string
	// User owns it: only its requests reach it.
	User        string
	ImageDigest string
	Created     time.Time
	// PreviewToken, 128 random bits, lets a client reach its ports
	// (DialPort, through serve) without the API token.
	PreviewToken string

	opt  Options
	live *runner.Live
	// memory is its memory limit, which the set's sandboxes.max_memory
	// counts.
	memory int64

	ports   ports
	mu      sync.Mutex
	expires time.Time
	timer   *time.Timer
	procs   []*Process // in order of start
	closed  bool
	// records are the processes that ended, as the audit record lists
	// them (at most audit.MaxProcesses); unlisted counts those past it.
	records  []audit.Process
	unlisted int
	wg       sync.WaitGroup // the processes' watchers

	closeOnce sync.Once
	closeErr  error
	done      chan struct{}
}

// Create sets up a live sandbox from p (its program replaced by Holder)
// with r, for user. Its lifetime starts now.
func Create(ctx context.Context, r *runner.Runner, p *task.Plan, user string, opt Options) (*Sandbox, error) {
	if opt.MaxLifetime <= 0 {
		opt.MaxLifetime = DefaultMaxLifetime
	}
	if opt.Lifetime <= 0 {
		opt.Lifetime = DefaultLifetime
	}
	if opt.Lifetime > opt.MaxLifetime {
		return nil, fmt.Errorf("timeout %v is past the sandboxes' max lifetime %v", opt.Lifetime, opt.MaxLifetime)
	}
	if opt.OutputBytes <= 0 {
		opt.OutputBytes = DefaultOutputBytes
	}
	hp := HolderPlan(p)
	// The holder's own bound is the max lifetime, and a margin: the
	// sandbox's timer ends it first.
	live, err := r.Live(ctx, hp, opt.MaxLifetime+time.Minute)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	s := &Sandbox{ID: newID("sb-"), PreviewToken: newID(""), User: user, ImageDigest: live.ImageDigest, Created: now, opt: opt, live: live,
		expires: now.Add(opt.Lifetime), done: make(chan struct{}), memory: p.Limits.Memory}
	s.timer = time.AfterFunc(opt.Lifetime, func() { _ = s.end(EndExpired) })
	go func() {
		// A holder that died (killed from inside) ends the sandbox.
		select {
		case <-live.Ended():
			_ = s.end(EndHolder)
		case <-s.done:
		}
	}()
	return s, nil
}

// HolderPlan is p as a live sandbox's: its program Holder, with no code
// or stdin, marked Live. A pool seeded with it keeps sandboxes ready for
// live sandboxes of p's shape (runner.Pool.Seed).
func HolderPlan(p *task.Plan) *task.Plan {
	hp := *p
	hp.Argv = slices.Clone(Holder)
	hp.Stdin, hp.Code, hp.CodeFile = nil, nil, ""
	hp.Live = true
	return &hp
}

// newID is prefix and 128 random bits in hex.
func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Info is the sandbox as the API shows it.
func (s *Sandbox) Info() runapi.SandboxInfo {
	return runapi.SandboxInfo{ID: s.ID, ExpiresAt: s.ExpiresAt(), Image: s.ImageDigest, Created: s.Created, PreviewToken: s.PreviewToken}
}

// ExpiresAt is when the sandbox ends unless extended.
func (s *Sandbox) ExpiresAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expires
}

// Done is closed once the sandbox has ended and is torn down.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// ended says whether the sandbox has ended (Close began).
func (s *Sandbox) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// ErrEnded is the error of a request to a sandbox that has ended.
var ErrEnded = errkind.New(errkind.NotFound, "the sandbox has ended")

// SetTimeout makes the sandbox end d from now, within its max lifetime
// from its creation.
func (s *Sandbox) SetTimeout(d time.Duration) (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return time.Time{}, ErrEnded
	}
	at := time.Now().Add(d)
	if d <= 0 || at.After(s.Created.Add(s.opt.MaxLifetime)) {
		return time.Time{}, errkind.Mark(errkind.Invalid, fmt.Errorf("timeout %v: a sandbox lives at most %v from its creation (sandboxes.max_lifetime)", d, s.opt.MaxLifetime))
	}
	s.timer.Reset(d)
	s.expires = at
	return at, nil
}

// ExecRequest is a process to start.
type ExecRequest = runapi.ExecRequest

func argvOf(req *ExecRequest) ([]string, error) {
	switch {
	case len(req.Command) > 0 && req.Cmd != "":
		return nil, errkind.Mark(errkind.Invalid, errors.New("command and cmd are mutually exclusive"))
	case len(req.Command) > 0:
		return slices.Clone(req.Command), nil
	case req.Cmd != "":
		return []string{"/bin/sh", "-c", req.Cmd}, nil
	}
	return nil, errkind.Mark(errkind.Invalid, errors.New("no command: give command (an argv) or cmd (a shell line)"))
}

func envOf(req *ExecRequest) ([]string, error) {
	out := make([]string, 0, len(req.Env))
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		v := req.Env[k]
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, errkind.Mark(errkind.Invalid, fmt.Errorf("env %q: not a variable name and value", k))
		}
		out = append(out, k+"="+v)
	}
	return out, nil
}

// Exec starts a process in the sandbox; its events come from the
// Process.
func (s *Sandbox) Exec(req ExecRequest) (*Process, error) {
	args, err := argvOf(&req)
	if err != nil {
		return nil, err
	}
	vars, err := envOf(&req)
	if err != nil {
		return nil, err
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/workspace"
	}
	if !path.IsAbs(cwd) {
		cwd = path.Join("/workspace", cwd)
	}
	var size *backend.WinSize
	if req.TTY != nil {
		if size, err = winSize(*req.TTY); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrEnded
	}
	if size != nil {
		return s.execTTYLocked(args, vars, cwd, size, req.Timeout)
	}
	pipes, err := s.live.Pipes()
	if err != nil {
		return nil, err
	}
	sp, err := s.live.Spawn(backend.Process{Args: args, Env: vars, Cwd: cwd,
		Stdin: pipes.InR, Stdout: pipes.OutW, Stderr: pipes.ErrW})
	pipes.CloseChildEnds()
	if err != nil {
		pipes.CloseAll()
		return nil, err
	}
	p := s.startLocked(args, sp)
	p.stdin = pipes.InW
	if !req.Stdin {
		p.closeStdinLocked()
	}
	s.wg.Go(func() {
		p.run(req.Timeout, stream{pipes.OutR, "stdout"}, stream{pipes.ErrR, "stderr"})
		s.noteEnded(p)
	})
	return p, nil
}

// execTTYLocked starts a process whose stdio is a pseudo-terminal of
// size: its output comes as "pty" events, its stdin goes to the
// terminal and stays open.
func (s *Sandbox) execTTYLocked(args, vars []string, cwd string, size *backend.WinSize, timeout time.Duration) (*Process, error) {
	sp, err := s.live.Spawn(backend.Process{Args: args, Env: vars, Cwd: cwd, TTY: size})
	if err != nil {
		return nil, err
	}
	p := s.startLocked(args, sp)
	p.pty = sp.PTY()
	p.stdin = p.pty
	s.wg.Go(func() {
		p.run(timeout, stream{p.pty, "pty"})
		s.noteEnded(p)
	})
	return p, nil
}

// startLocked keeps sp, just started, as a process of the sandbox.
func (s *Sandbox) startLocked(args []string, sp backend.Spawned) *Process {
	p := newProcess(args, s.opt.OutputBytes)
	p.pid, p.sp = sp.Pid(), sp
	p.appendLocked(Event{Event: "start", Pid: p.pid})
	s.procs = append(s.procs, p)
	s.trimLocked()
	return p
}

// winSize is size as a terminal's, refused outside 1..MaxTTYSize.
func winSize(size runapi.TTYSize) (*backend.WinSize, error) {
	if size.Rows < 1 || size.Rows > runapi.MaxTTYSize || size.Cols < 1 || size.Cols > runapi.MaxTTYSize {
		return nil, errkind.Mark(errkind.Invalid, fmt.Errorf("a terminal of %d rows and %d columns: each is 1 to %d", size.Rows, size.Cols, runapi.MaxTTYSize))
	}
	return &backend.WinSize{Rows: uint16(size.Rows), Cols: uint16(size.Cols)}, nil
}

// trimLocked forgets the oldest ended processes past maxProcesses, and
// while the ended ones keep more than maxEndedOutput.
func (s *Sandbox) trimLocked() {
	var kept int64
	for _, p := range s.procs {
		kept += p.endedOutput()
	}
	for i := 0; (len(s.procs) > maxProcesses || kept > maxEndedOutput) && i < len(s.procs); {
		if s.procs[i].Exit() != nil {
			kept -= s.procs[i].endedOutput()
			s.procs = slices.Delete(s.procs, i, i+1)
			continue
		}
		i++
	}
}

// Process is the process of pid (inside the sandbox) that the sandbox
// started, nil if none.
func (s *Sandbox) Process(pid int) *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.procs) - 1; i >= 0; i-- {
		if s.procs[i].pid == pid {
			return s.procs[i]
		}
	}
	return nil
}

// Processes lists its processes, running and recently ended.
func (s *Sandbox) Processes() []Info {
	s.mu.Lock()
	procs := slices.Clone(s.procs)
	s.mu.Unlock()
	out := make([]Info, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.Info())
	}
	return out
}

// noteEnded keeps p, whose exit event is in, for the audit record.
func (s *Sandbox) noteEnded(p *Process) {
	rec := p.record()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trimLocked() // its output now counts among the ended ones'
	if len(s.records) >= audit.MaxProcesses {
		s.unlisted++
		return
	}
	s.records = append(s.records, rec)
}

// Why a sandbox ended, as its audit record says.
const (
	EndDeleted = "deleted"          // Close: DELETE, or its door's end
	EndExpired = "expired"          // its timeout
	EndStopped = "server stopped"   // CloseAll: serve's stop
	EndHolder  = "its holder ended" // killed from inside, or its lifetime
)

// Close kills every process of the sandbox (its whole cgroup), tears
// everything down as after a run, and writes its audit record; later
// calls return the first's error.
func (s *Sandbox) Close() error { return s.end(EndDeleted) }

// end is Close, the record saying why the sandbox ended (the first
// call's why).
func (s *Sandbox) end(why string) error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.timer.Stop()
		s.mu.Unlock()
		s.ports.closeAll()
		err := s.live.Close()
		// Every process died with the cgroup: their watchers end, each
		// noting its process for the record.
		s.wg.Wait()
		s.closeErr = errors.Join(err, s.writeRecord(why))
		close(s.done)
	})
	return s.closeErr
}

// writeRecord writes the sandbox's audit record, once it is torn down:
// the runner's part (image, limits, network, usage) and its own (id,
// user, why it ended, its processes).
func (s *Sandbox) writeRecord(why string) error {
	rec := s.live.Record()
	rec.ID, rec.User, rec.Ended = s.ID, s.User, why
	s.mu.Lock()
	rec.Processes, rec.ProcessesNotListed = s.records, s.unlisted
	s.mu.Unlock()
	if err := s.live.WriteRecord(rec); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.ID, err)
	}
	return nil
}
