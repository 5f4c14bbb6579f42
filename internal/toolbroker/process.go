package toolbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/secret"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/uidpool"
	"github.com/agentrun/agentrun/runtime/cgroup"
)

// Network is a stdio server's own network (Options.Network): a network
// namespace joined by a veth to a proxy that lets it reach the hosts of
// its Allow alone.
type Network struct {
	// Netns is the namespace the server joins; the broker closes it once
	// the server has started.
	Netns *os.File
	// Env is the proxy's variables, added to the server's environment
	// where the config sets none of the same name.
	Env map[string]string
	// ResolvConf and Hosts are bound over the server's /etc/resolv.conf
	// and /etc/hosts.
	ResolvConf, Hosts []byte
	// Close tears the network down, once the server is gone.
	Close func() error
}

// startOpts are where and as whom a server's process starts: its cgroup
// ("" none) and the dir of the cgroup parent's lock ("" none), the pool
// its uid comes from (nil: agentrun is not root and runs it unfenced as
// itself) and the reservation's owner, and the maker of its network.
type startOpts struct {
	cgPath, lockDir string
	uids            *uidpool.Range
	owner           string
	network         func(Server) (*Network, error)
}

// process is a stdio server's process: its pipes, its cgroup (nil
// without one), the tail of its stderr and the secrets of its
// environment (kept out of the log), and the undo of its start.
type process struct {
	cmd     *exec.Cmd
	cg      *cgroup.Cgroup
	stdin   io.WriteCloser
	stdout  io.ReadCloser
	stderr  *tail
	secrets []string
	done    chan struct{} // closed when the process has been waited for
	lockDir string        // of the cgroup-parent lock; "" none
	uid     uint32        // the pool's uid it runs as; 0 none
	undo    cleanup.Cleanup
	// A fenced process's: agentrun's ends of the fence init's spec and
	// error pipes (fencePipes); the cgroup's dir it starts in, on v2.
	specW, errR *os.File
	cgDir       *os.File
}

// startProcess starts s's command in a process group and, with
// o.cgPath, a cgroup of its own, with s's environment alone. As root it
// starts it fenced (see fenceArg0): as a uid and gid of its own from
// o.uids, in namespaces of its own, with no capability and no_new_privs,
// in a network of its own from o.network when s.Allow names hosts, else
// in none. Without root it runs it as agentrun's own user, unfenced (a
// test's). It returns once the command is executed, within ctx.
func startProcess(ctx context.Context, s Server, o startOpts, limit int64, tooLarge *atomic.Uint64) (_ *process, err error) {
	env, secrets, err := environment(s)
	if err != nil {
		return nil, err
	}
	p := &process{stderr: &tail{}, secrets: secrets, done: make(chan struct{}), lockDir: o.lockDir}
	defer func() {
		if err != nil {
			p.undo.Clean()
		}
	}()
	var cmd *exec.Cmd
	var spec *fenceSpec
	if os.Geteuid() == 0 {
		if cmd, spec, err = p.fence(s, o, env); err != nil {
			return nil, err
		}
	} else {
		if int(s.UID) != os.Geteuid() || int(s.GID) != os.Getegid() || len(s.Allow) > 0 {
			return nil, fmt.Errorf("cannot run as %d:%d, or with a network of its own: agentrun is not root", s.UID, s.GID)
		}
		cmd = exec.Command(s.Command[0], s.Command[1:]...)
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.Dir, cmd.Stderr, cmd.WaitDelay = "/", p.stderr, exitWait
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Pdeathsig = true, syscall.SIGKILL
	if err := p.makeCgroup(cmd, o); err != nil {
		return nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p.undo.Add(closer(inW))
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		return nil, err
	}
	p.undo.Add(closer(outR))
	cmd.Stdin, cmd.Stdout = inR, outW
	if spec != nil {
		if err := p.fencePipes(cmd); err != nil {
			inR.Close()
			outW.Close()
			return nil, err
		}
	}
	err = startFromForkThread(cmd)
	inR.Close()
	outW.Close()
	for _, f := range cmd.ExtraFiles {
		f.Close() // the child's ends, and the network namespace
	}
	if p.cgDir != nil {
		p.cgDir.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", s.Command[0], err)
	}
	p.cmd, p.stdin, p.stdout = cmd, inW, &lineLimit{rc: outR, limit: limit, tooLarge: tooLarge}
	go func() { cmd.Wait(); close(p.done) }()
	p.undo.Add(p.kill)
	// On cgroup v1 the process joins its cgroup just after it started:
	// what it forks before that is in its process group, killed too.
	if p.cg != nil && !cgroup.Unified() {
		if err := p.cg.Join(cmd.Process.Pid); err != nil {
			return nil, err
		}
	}
	if spec != nil {
		if err := p.fenced(ctx, spec); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// fence is the command of the fence init that becomes s (see fenceArg0),
// and its spec: s's own uid and gid from o.uids, its network from
// o.network when s.Allow names hosts. What it takes is given back
// through p.undo, the uid once p is gone.
func (p *process) fence(s Server, o startOpts, env []string) (*exec.Cmd, *fenceSpec, error) {
	if o.uids == nil {
		return nil, nil, errors.New("no uid pool to run the tool server as a user of its own (run_uids)")
	}
	if s.UID == 0 || s.GID == 0 {
		return nil, nil, errors.New("a tool server never runs as root (uid or gid 0)")
	}
	uid, err := o.uids.Take(o.owner)
	if err != nil {
		return nil, nil, fmt.Errorf("run_uids: %w", err)
	}
	p.uid = uid
	p.undo.Add(func() error { return p.freeUID(o) })
	spec := &fenceSpec{Argv: s.Command, Env: env, UID: uid, GID: uid, Groups: []uint32{}}
	if s.GID != config.NobodyID {
		// The config's user keeps its group, so that the files it
		// shares with the server stay readable to it; nobody's group
		// holds nothing.
		spec.Groups = []uint32{s.GID}
	}
	cmd := exec.Command("/proc/self/exe")
	cmd.Args, cmd.Env = []string{fenceArg0}, []string{fenceEnv}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: fenceFlags}
	if len(s.Allow) == 0 {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNET
		return cmd, spec, nil
	}
	if o.network == nil {
		return nil, nil, errors.New("the tool server's allow names hosts, and this agentrun gives tool servers no network")
	}
	n, err := o.network(s)
	if err != nil {
		return nil, nil, fmt.Errorf("the tool server's network: %w", err)
	}
	p.undo.Add(n.Close)
	p.undo.Add(closer(n.Netns)) // closed at the start, or by the undo of a failed one
	spec.Netns, spec.ResolvConf, spec.Hosts = true, n.ResolvConf, n.Hosts
	for _, k := range slices.Sorted(maps.Keys(n.Env)) {
		if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, k+"=") }) {
			spec.Env = append(spec.Env, k+"="+n.Env[k])
		}
	}
	cmd.ExtraFiles = []*os.File{nil, nil, n.Netns} // fenceSpecFD and fenceErrFD are set by fencePipes
	return cmd, spec, nil
}

// fencePipes gives cmd, a fence init, the child's ends of its spec's
// pipe and its error pipe (fenceSpecFD, fenceErrFD; the network
// namespace, if any, stays fenceNetFD), and keeps agentrun's ends in p
// until fenced has used them.
func (p *process) fencePipes(cmd *exec.Cmd) error {
	specR, specW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return err
	}
	p.specW, p.errR = specW, errR
	p.undo.Add(closer(specW))
	p.undo.Add(closer(errR))
	files := []*os.File{specR, errW}
	if len(cmd.ExtraFiles) > 2 {
		files = append(files, cmd.ExtraFiles[2])
	}
	cmd.ExtraFiles = files
	return nil
}

// fenced hands the fence init its spec and waits, within ctx, until it
// has executed the command (its error pipe ends empty) or failed (it
// says why there).
func (p *process) fenced(ctx context.Context, spec *fenceSpec) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	said := make(chan []byte, 1)
	go func() {
		// The init reads its spec whole before it does anything; a write
		// that fails (the init died) leaves it to say why, or to end.
		p.specW.Write(b)
		p.specW.Close()
		msg, _ := io.ReadAll(io.LimitReader(p.errR, maxFenceErr))
		said <- msg
	}()
	select {
	case msg := <-said:
		if len(msg) > 0 {
			return cut(errors.New(string(msg)))
		}
		return nil
	case <-ctx.Done():
		// The undo kills the init, which ends the reads and writes above.
		return fmt.Errorf("the fence did not start the command in time: %w", ctx.Err())
	}
}

// makeCgroup makes p's cgroup at o.cgPath (none without), which cmd starts
// in on cgroup v2 (on v1 the process joins it once started).
func (p *process) makeCgroup(cmd *exec.Cmd, o startOpts) error {
	if o.cgPath == "" {
		return nil
	}
	if o.lockDir != "" {
		// The cgroup is made and joined while its parent cannot be
		// removed by another server's end.
		unlock, err := state.LockCgroupParent(o.lockDir, false)
		if err != nil {
			return err
		}
		defer unlock()
	}
	limit := int64(ServerMemory)
	pids := int64(ServerPids)
	cg, err := cgroup.New(o.cgPath, &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit, Swap: &limit}, Pids: &specs.LinuxPids{Limit: &pids}})
	if err != nil {
		return err
	}
	p.cg = cg
	p.undo.Add(p.removeCgroup)
	if cgroup.Unified() {
		dir, err := p.cg.OpenDir()
		if err != nil {
			return err
		}
		// Closed once the process has started, with the fork's other files.
		p.cgDir = dir
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
	}
	return nil
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

// stop closes the server's stdin, waits up to exitWait for it to exit,
// then undoes its start: its process group and every process of its
// cgroup killed (with the init of its pid namespace, every process of
// that), its cgroup removed, its network torn down and its uid given
// back, once it is gone.
func (p *process) stop() error {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(exitWait):
	}
	return p.undo.Clean()
}

// kill kills p's process group and every process of its cgroup, and waits
// until it has been reaped.
func (p *process) kill() error {
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
	return errors.Join(errs...)
}

// gone reports whether p's process never started or has been reaped:
// as the init of its pid namespace, with every process of that.
func (p *process) gone() bool {
	if p.cmd == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// freeUID gives p's uid back to o.uids once p is gone; while a process
// may still run as it, it stays reserved (gc reclaims it with the run).
func (p *process) freeUID(o startOpts) error {
	if !p.gone() {
		return fmt.Errorf("uid %d kept reserved: the tool server's process is not gone", p.uid)
	}
	return o.uids.Free(p.uid, o.owner)
}

// closer is the undo step that closes f, which may be closed already
// (stop closes the server's stdin first).
func closer(f *os.File) func() error {
	return func() error {
		if err := f.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return err
		}
		return nil
	}
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
