package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
)

// execWait bounds how long Spawn waits for the holder's start and for
// `runsc exec` to have started its process (its pid written), and a
// port's forward: milliseconds, seconds on a busy host.
const execWait = 30 * time.Second

// Spawn starts proc in the running sandbox with `runsc exec`: gVisor's
// kernel starts it in the container, beside the holder, in the sandbox's
// cgroup, as the container's user, with no capabilities (every set
// empty), no_new_privs and the container's rlimits. The process's stdio
// are proc's files, donated to the sandbox as a run's are; the `runsc
// exec` that waits for it is a host process of agentrun's, its exit
// status the process's (128+n for one signal n ended), killed with the
// sandbox (Destroy).
//
// With proc.TTY, the process's stdio is a pseudo-terminal made on the
// host (newPTY) whose other end `runsc exec` donates to the sandbox, as
// `runsc exec -t` has it on a terminal: gVisor's kernel makes it the
// process's controlling terminal, a host terminal whose ioctls it
// answers itself or passes on (the size, termios), and refuses the rest
// (TIOCSTI, TIOCSETD: ENOTTY).
func (p *prepared) Spawn(proc backend.Process) (backend.Spawned, error) {
	if len(proc.Args) == 0 {
		return nil, errors.New("spawn: no command")
	}
	if err := p.running(); err != nil {
		return nil, fmt.Errorf("spawn: %w", err)
	}
	n, ok := p.live.next()
	if !ok {
		return nil, errors.New("spawn: the sandbox has ended")
	}
	// Host-made, in the bundle (root's, 0700): runsc reads the process
	// from it and writes the pid there; gone once the process started.
	dir := filepath.Join(p.bundle, "exec-"+strconv.Itoa(n))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spawn: %w", err)
	}
	defer os.RemoveAll(dir)
	data, err := json.Marshal(p.execProcess(proc))
	if err != nil {
		return nil, fmt.Errorf("spawn: encoding the process: %w", err)
	}
	procFile, pidFile := filepath.Join(dir, "process.json"), filepath.Join(dir, "pid")
	if err := os.WriteFile(procFile, data, 0o600); err != nil {
		return nil, fmt.Errorf("spawn: %w", err)
	}
	args := []string{"exec", "--process", procFile, "--internal-pid-file", pidFile, p.id}
	s := &execed{p: p, done: make(chan struct{})}
	stdin, stdout, stderr := proc.Stdin, proc.Stdout, proc.Stderr
	if proc.TTY != nil {
		var peer *os.File
		if s.pty, peer, err = newPTY(proc.TTY); err != nil {
			return nil, fmt.Errorf("spawn: %w", err)
		}
		defer peer.Close()
		stdin, stdout, stderr = peer, peer, peer
	}

	cmd := exec.Command(p.b.path, append(execGlobal(p.global), args...)...)
	cmd.Env = []string{"PATH=" + spec.DefaultPath}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	// Its own process group, killed with agentrun (the parent-death
	// signal follows the thread that started it, kept until it ends).
	// With a terminal, its own session whose controlling terminal it
	// is: a typed ^C or a resize signals it, and runsc exec forwards the
	// signal to the terminal's foreground process in the sandbox.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if proc.TTY != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.live.add(cmd)
		started <- nil
		_ = cmd.Wait()
		s.state = cmd.ProcessState
		p.live.remove(cmd)
		close(s.done)
	}()
	if err := <-started; err != nil {
		if s.pty != nil {
			s.pty.Close()
		}
		return nil, fmt.Errorf("spawn: starting runsc exec: %w", err)
	}
	fail := func(err error) (backend.Spawned, error) {
		// A process runsc started without telling its pid dies with
		// the sandbox at the latest.
		_ = cmd.Process.Kill()
		<-s.done
		if s.pty != nil {
			s.pty.Close()
		}
		return nil, fmt.Errorf("starting a process in sandbox %s: %w", p.id, err)
	}
	if s.pid, err = readPid(pidFile, s.done, time.Now().Add(execWait)); err != nil {
		return fail(err)
	}
	return s, nil
}

// running waits for the holder's start (Exec, which runs beside the
// sandbox's first requests) and says whether the sandbox runs.
func (p *prepared) running() error {
	select {
	case <-p.started:
	case <-time.After(execWait):
		return errors.New("the sandbox's holder has not started")
	}
	if p.startErr != nil {
		return fmt.Errorf("the sandbox's holder did not start: %w", p.startErr)
	}
	if !p.alive() {
		return errors.New("the sandbox has ended")
	}
	return nil
}

// execProcess is the OCI process of proc, the container's own but for
// its argv, working directory, environment (proc's added, later wins)
// and terminal, with no capability in any set and no_new_privs.
func (p *prepared) execProcess(proc backend.Process) *specs.Process {
	sp := *p.proc
	sp.Args = slices.Clone(proc.Args)
	sp.Env = mergeEnv(p.proc.Env, proc.Env)
	if proc.Cwd != "" {
		sp.Cwd = proc.Cwd
	}
	sp.Terminal, sp.ConsoleSize = false, nil
	if proc.TTY != nil {
		sp.Terminal = true
		sp.ConsoleSize = &specs.Box{Height: uint(proc.TTY.Rows), Width: uint(proc.TTY.Cols)}
	}
	sp.Capabilities = &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{},
		Inheritable: []string{}, Permitted: []string{}, Ambient: []string{}}
	sp.NoNewPrivileges = true
	return &sp
}

// mergeEnv is base with add's variables, each replacing base's of the
// same name.
func mergeEnv(base, add []string) []string {
	out := slices.Clone(base)
	for _, kv := range add {
		name, _, _ := strings.Cut(kv, "=")
		out = slices.DeleteFunc(out, func(o string) bool { n, _, _ := strings.Cut(o, "="); return n == name })
		out = append(out, kv)
	}
	return out
}

// execGlobal is global, runsc's flags for the sandbox, with a `runsc
// exec`'s log discarded: one per process would grow the sandbox's log
// without bound, and its errors reach the process's stderr.
func execGlobal(global []string) []string {
	out := slices.Clone(global)
	for i, a := range out {
		if strings.HasPrefix(a, "--log=") {
			out[i] = "--log=/dev/null"
		}
	}
	return out
}

// newPTY makes a pseudo-terminal of size on the host: its master,
// non-blocking (backend.PTYMaster), and its other end, opened from the
// master (TIOCGPTPEER), never by a path.
func newPTY(size *backend.WinSize) (master, peer *os.File, err error) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening /dev/ptmx: %w", err)
	}
	defer ptmx.Close()
	raw, err := ptmx.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	pfd := -1
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		if cerr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); cerr != nil {
			cerr = fmt.Errorf("unlocking the terminal: %w", cerr)
			return
		}
		if cerr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols}); cerr != nil {
			cerr = fmt.Errorf("sizing the terminal: %w", cerr)
			return
		}
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
		if errno != 0 {
			cerr = fmt.Errorf("opening the terminal's other end: %w", errno)
			return
		}
		pfd = int(r)
	}); err != nil {
		return nil, nil, err
	}
	if cerr != nil {
		return nil, nil, cerr
	}
	peer = os.NewFile(uintptr(pfd), "pty-peer")
	if master, err = backend.PTYMaster(ptmx); err != nil {
		peer.Close()
		return nil, nil, err
	}
	return master, peer, nil
}

// readPid waits for `runsc exec` to write the process's pid inside the
// sandbox to file, until deadline or done (it ended without).
func readPid(file string, done <-chan struct{}, deadline time.Time) (int, error) {
	for {
		b, err := os.ReadFile(file)
		if err == nil && len(b) > 0 {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid <= 0 {
				return 0, fmt.Errorf("runsc exec wrote pid %q", b)
			}
			return pid, nil
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("reading the process's pid: %w", err)
		}
		select {
		case <-done:
			return 0, errors.New("runsc exec ended before it started the process")
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("runsc exec did not start the process within %v", execWait)
		}
	}
}

// execed is a process Spawn started: the `runsc exec` waiting for it.
type execed struct {
	p     *prepared
	pid   int
	pty   *os.File
	done  chan struct{}
	state *os.ProcessState // runsc exec's, once done is closed
}

func (s *execed) Pid() int      { return s.pid }
func (s *execed) PTY() *os.File { return s.pty }

// Signal sends sig to the process inside the sandbox (`runsc kill
// --pid`), never to the `runsc exec` that waits for it; an ended one is
// refused.
func (s *execed) Signal(sig os.Signal) error {
	n, ok := sig.(syscall.Signal)
	if !ok {
		return fmt.Errorf("signal %v is not a signal number", sig)
	}
	select {
	case <-s.done:
		return os.ErrProcessDone
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), killGrace)
	defer cancel()
	if _, err := s.p.b.command(ctx, nil, execGlobal(s.p.global), "kill", "--pid", strconv.Itoa(s.pid), s.p.id, strconv.Itoa(int(n))); err != nil {
		return fmt.Errorf("signalling process %d of sandbox %s: %w", s.pid, s.p.id, err)
	}
	return nil
}

// Wait waits for `runsc exec`, which exits with the process's status.
func (s *execed) Wait() (*os.ProcessState, error) {
	<-s.done
	if s.state == nil {
		return nil, errors.New("runsc exec could not be waited for")
	}
	return s.state, nil
}

// liveExecs are the `runsc exec` commands of a sandbox's processes.
type liveExecs struct {
	mu     sync.Mutex
	n      int
	cmds   map[*exec.Cmd]struct{}
	closed bool
}

// next numbers a new process, false once the sandbox is destroyed.
func (l *liveExecs) next() (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	return l.n, !l.closed
}

// add keeps cmd, just started, to be killed with the sandbox (at once
// if the sandbox is destroyed already).
func (l *liveExecs) add(cmd *exec.Cmd) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = cmd.Process.Kill()
		return
	}
	if l.cmds == nil {
		l.cmds = map[*exec.Cmd]struct{}{}
	}
	l.cmds[cmd] = struct{}{}
}

// remove forgets cmd, ended and reaped.
func (l *liveExecs) remove(cmd *exec.Cmd) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.cmds, cmd)
}

// killAll kills every `runsc exec` still there (the sandbox is dead or
// dying: the processes they wait for are gone with it); their own
// goroutines reap them.
func (l *liveExecs) killAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for cmd := range l.cmds {
		_ = cmd.Process.Kill()
	}
}

var (
	_ backend.Live       = (*prepared)(nil)
	_ backend.PortDialer = (*prepared)(nil)
	_ backend.Spawned    = (*execed)(nil)
)

// DialPort connects to TCP port on the sandbox's loopback, as gVisor's
// netstack has it (the host namespace's loopback is not the sandbox's):
// `runsc port-forward --stream` connects to a socket listening in the
// sandbox's bundle and donates that connection to the sandbox, which
// joins it to a connection of its own to the port.
func (p *prepared) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: not a TCP port", port)
	}
	if err := p.running(); err != nil {
		return nil, err
	}
	n, ok := p.live.next()
	if !ok {
		return nil, errors.New("the sandbox has ended")
	}
	dir := filepath.Join(p.bundle, "port-"+strconv.Itoa(n))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("port %d: %w", port, err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "stream.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("port %d: %w", port, err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(ctx, execWait)
	defer cancel()
	forwarded := make(chan error, 1)
	go func() {
		_, err := p.b.command(ctx, nil, execGlobal(p.global), "port-forward", "--stream", sock, p.id, strconv.Itoa(port))
		if err != nil {
			_ = l.SetDeadline(time.Now()) // it will not connect
		}
		forwarded <- err
	}()
	deadline, _ := ctx.Deadline()
	if err := l.SetDeadline(deadline); err != nil {
		return nil, err
	}
	c, aerr := l.AcceptUnix()
	// runsc connects, then asks the sandbox to forward: its end is a
	// connection to the port once it has ended well.
	if err := <-forwarded; err != nil {
		if c != nil {
			c.Close()
		}
		return nil, fmt.Errorf("port %d in the sandbox: %w", port, err)
	}
	if aerr != nil {
		return nil, fmt.Errorf("port %d in the sandbox: %w", port, aerr)
	}
	return c, nil
}
