package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	_ "github.com/opencontainers/cgroups/devices" // device rules for libcontainer's cgroup manager
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// Backend runs containers with libcontainer. Its zero value is not usable:
// StateDir must be set.
type Backend struct {
	// StateDir holds libcontainer's per-container state (e.g. /run/agentrun/runc).
	StateDir string
	// SeccompHelper is the host path of agentrun-seccomp, which loads a
	// sandbox's seccomp filter compiled once per process (seccomp.go);
	// "" has libcontainer compile the filter in every container's init.
	SeccompHelper string
	// SeccompCache keeps compiled filters for later processes; "" keeps
	// them in memory only.
	SeccompCache string
	// CgroupParent holds the runs' cgroups (config key cgroup_parent);
	// "" is the package's CgroupParent.
	CgroupParent string
}

// New returns a backend keeping container state under stateDir.
func New(stateDir string) (*Backend, error) {
	if !seccomp.Enabled {
		return nil, errors.New("agentrun was built without seccomp support: build it with CGO_ENABLED=1 -tags seccomp (make build)")
	}
	if !filepath.IsAbs(stateDir) {
		return nil, fmt.Errorf("runc state dir %q is not absolute", stateDir)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating runc state dir: %w", err)
	}
	return &Backend{StateDir: stateDir}, nil
}

// Traits: libcontainer runs on the shared image rootfs, and a prepared
// container's init waits for the exec of the program, so it can be pooled;
// or it execs the program at once, which then waits for its hand-over
// (warm). A pooled container (Container.Ahead) whose filter the helper
// loads goes further ahead: see Prepare.
func (b *Backend) Traits() backend.Traits {
	return backend.Traits{CgroupParent: b.cgroupParent(), Poolable: true, Warm: true}
}

// CgroupParent holds the cgroups of libcontainer runs unless the backend
// names another.
const CgroupParent = "/agentrun"

func (b *Backend) cgroupParent() string {
	if b.CgroupParent != "" {
		return b.CgroupParent
	}
	return CgroupParent
}

// Prepared is a container whose init has done all of its set-up
// (namespaces, cgroup, mounts, pivot_root) and waits to exec the program,
// or, prepared ahead (Container.Ahead), whose program's start waits for
// its hand-over. Its program runs once, by Exec; Destroy removes it, run
// or not.
type Prepared struct {
	stateDir string
	ctr      *libcontainer.Container
	cg       *cgroup.Cgroup
	stdio    *backend.Pipes
	proc     *libcontainer.Process
	reaped   bool // the init has been waited for
	// initFD is a pidfd of the init, -1 if none could be opened: it
	// becomes readable when the init ends.
	initFD int
	// mntFD holds the sandbox's mount namespace until Destroy, -1 if it
	// could not be opened: see holdMounts.
	mntFD int
	// handover, for a warm container, is the channel to its program,
	// which runs from Prepare on; nil once handed over.
	handover *backend.Handover
	// spawn is what every process Spawn starts shares with the program.
	spawn spawnBase
	// started is closed once Exec has let the program go on (or failed
	// to), startErr its error: Spawn waits for it.
	started  chan struct{}
	startErr error
}

// Prepare creates c's container and starts its init, which stops just
// before the exec of the program. Once ctx is done it stops, at the latest
// when the init has done its set-up (libcontainer's own steps cannot be
// cut short), with an error that wraps ctx's. On error nothing is left
// behind.
//
// A container prepared ahead of its run (c.Ahead), whose filter the
// helper loads, is taken further, up to the program's own exec: its init
// execs the helper, which loads the filter and execs the sandbox's init
// (tini), which starts the program's start (the helper again, with
// --handover), which says on a hand-over channel that it is ready and
// waits there. Its Exec hands over, and the start execs the program:
// what a run then waits for is the program's exec alone, not the
// libcontainer init's exec, the filter's load and tini's start before it.
// Nothing of the task runs before the hand-over, and everything that runs
// before it runs under all of the sandbox's restrictions.
func (b *Backend) Prepare(ctx context.Context, c *backend.Container) (_ backend.Prepared, err error) {
	s := c.Spec
	if c.Handover != nil {
		defer func() {
			if err != nil {
				c.Handover.Close()
			}
		}()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("preparing container: %w", err)
	}
	warmJSONOnce.Do(func() { go warmJSON() })
	// The filter compiled once, loaded by the helper (see seccomp.go).
	var extra []*os.File
	filter := b.precompiled(s.Linux.Seccomp)
	if filter != nil {
		s, extra = b.withPrecompiledSeccomp(s), []*os.File{filter}
	}
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   c.ID,
		Spec:         s,
		NoNewKeyring: true,
	})
	if err != nil {
		return nil, fmt.Errorf("converting spec: %w", err)
	}
	rlimits, err := rlimits(c.Spec.Process.Rlimits)
	if err != nil {
		return nil, err
	}
	cg, err := cgroup.Open(cfg.Cgroups.Path)
	if err != nil {
		return nil, err
	}

	unlock, err := state.LockCgroupParent(b.StateDir, false)
	if err != nil {
		return nil, err
	}
	unlock = sync.OnceFunc(unlock)
	defer unlock()
	// On error, what was made is undone, last first.
	var undo cleanup.Cleanup
	defer func() {
		if err != nil {
			_ = undo.Clean()
		}
	}()
	ctr, err := libcontainer.Create(b.StateDir, c.ID, cfg)
	if err != nil {
		// Create may leave a state dir without state.json behind.
		_ = os.RemoveAll(filepath.Join(b.StateDir, c.ID))
		return nil, fmt.Errorf("creating container: %w", err)
	}
	p := &Prepared{stateDir: b.StateDir, ctr: ctr, cg: cg, initFD: -1, mntFD: -1, handover: c.Handover, started: make(chan struct{})}
	undo.Add(p.Destroy)
	ahead := c.Handover == nil && c.Ahead && len(extra) > 0
	if ahead {
		if p.handover, err = backend.NewHandover("program's start"); err != nil {
			return nil, err
		}
	}
	// The cgroup-parent lock is released before Destroy, as it is on
	// success (RemoveCgroupParent, which takes it exclusively, may then
	// remove the parent).
	undo.Add(func() error { unlock(); return nil })

	if p.stdio, err = backend.NewPipes(); err != nil {
		return nil, err
	}
	nnp := true
	args := s.Process.Args
	if ahead {
		args = withStart(args)
	}
	if p.handover != nil {
		// The program's end after the helper's program (which the
		// helper closes before it execs the init).
		var child *os.File
		child, args = p.handover.Child(3+len(extra), args)
		extra = append(extra, child)
	}
	p.proc = &libcontainer.Process{
		Args:            args,
		ExtraFiles:      extra,
		Env:             c.Spec.Process.Env,
		Cwd:             c.Spec.Process.Cwd,
		UID:             int(c.Spec.Process.User.UID),
		GID:             int(c.Spec.Process.User.GID),
		Stdin:           p.stdio.InR,
		Stdout:          p.stdio.OutW,
		Stderr:          p.stdio.ErrW,
		NoNewPrivileges: &nnp,
		Rlimits:         rlimits,
		Init:            true,
		LogLevel:        logLevel(),
	}
	p.spawn = spawnBase{env: c.Spec.Process.Env, cwd: c.Spec.Process.Cwd,
		uid: p.proc.UID, gid: p.proc.GID, rlimits: rlimits, filter: filter}
	if err := ctr.Start(p.proc); err != nil {
		return nil, fmt.Errorf("starting container: %w", err)
	}
	p.stdio.CloseChildEnds()
	if p.handover != nil {
		p.handover.Passed()
	}
	if pid, err := p.proc.Pid(); err == nil {
		// The init is this process's child, not yet waited for: its pid
		// cannot have been reused. A pidfd is close-on-exec.
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			p.initFD = fd
		}
		p.holdMounts(pid)
	}
	// The cgroup exists from Start on and the program waits for Exec: its
	// socket buffers are capped before it can open a socket.
	if m := c.Spec.Linux.Resources.Memory; m != nil && m.Limit != nil && !cgroup.Unified() {
		st, err := ctr.State()
		if err != nil {
			return nil, fmt.Errorf("container state: %w", err)
		}
		if _, err := backend.ChargeSocketMemory(st.CgroupPaths["memory"], *m.Limit); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("preparing container: %w", err)
	}
	if p.handover != nil {
		// Warm, or started ahead: the program (or its start) runs now
		// and waits for its hand-over.
		if err := p.exec(ctx); err != nil {
			return nil, fmt.Errorf("starting the program ahead of its run: %w", err)
		}
	}
	if ahead {
		// A warm program's readiness is its caller's to wait for.
		if err := p.handover.Ready(ctx, startReadyWait); err != nil {
			return nil, fmt.Errorf("pooled sandbox, its program's start (%s --handover): %w", b.SeccompHelper, err)
		}
	}
	return p, nil
}

// startReadyWait bounds the wait for a pooled sandbox's program's start
// (Prepare): the helper's exec, the filter, tini and the start's exec, a
// few milliseconds on an idle host.
const startReadyWait = 10 * time.Second

// withStart returns args (the helper's, then the sandbox's init's) with
// the program's start, the helper with --handover, just before the
// program: after the init's "--", or right after the helper when the spec
// has no init.
func withStart(args []string) []string {
	i := 1
	if len(args) > 3 && args[1] == spec.InitPath && args[2] == "--" {
		i = 3
	}
	return slices.Concat(args[:i], []string{seccompHelperPath, "--handover", backend.FDArg}, args[i:])
}

// holdMounts opens the mount namespace of the sandbox whose init is pid,
// this process's child not yet waited for (its pid cannot have been
// reused). Held, it outlives the sandbox's last process: its mounts are
// taken down (with the wait for an RCU grace period that their detach
// takes) when Destroy closes it, after the run's answer, not in the exit
// of the sandbox's init, which the run's wait, and so its answer, waits
// for. If it cannot be opened it is not held, and is taken down in that
// exit, as without this.
func (p *Prepared) holdMounts(pid int) {
	if fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		p.mntFD = fd
	}
}

// ID is the container's ID.
func (p *Prepared) ID() string { return p.ctr.ID() }

// Ready reports whether the init still waits to exec the program, or,
// in a container whose program was started ahead, for its hand-over: it
// has not ended (one poll of its pidfd; only Exec lets it go on). Without
// a pidfd libcontainer's status is read, as runc does: its freezer and
// the init's stat file.
func (p *Prepared) Ready() bool {
	if p.reaped {
		return false
	}
	if p.initFD >= 0 {
		return !backend.Exited(p.initFD)
	}
	st, err := p.ctr.Status()
	if p.handover != nil {
		return err == nil && st == libcontainer.Running
	}
	return err == nil && st == libcontainer.Created
}

// Exec lets the program exec, feeds it stdin, and waits for it to end or for
// the timeout (or ctx) to kill the sandbox; output, if not nil, gets the
// kept output as it arrives. It may be called once.
func (p *Prepared) Exec(ctx context.Context, prog backend.Program) (out *backend.Outcome, err error) {
	stdin, timeout, outputLimit, output := prog.Stdin, prog.Timeout, prog.OutputLimit, prog.Output
	if p.reaped {
		return nil, errors.New("container already ran")
	}
	out = &backend.Outcome{}
	// Usage counts from here: the program's, not the init's set-up.
	p.cg.Start()
	start := time.Now()
	waitOutput := p.stdio.Serve(stdin, outputLimit, output)
	err = p.start(ctx)
	p.startErr = err
	close(p.started)
	if err != nil {
		// The pipes reach EOF once the init is gone; a warm program's
		// channel is closed only then, so that it never runs the task.
		p.kill(p.wait())
		if p.handover != nil {
			p.handover.Close()
			p.handover = nil
		}
		waitOutput()
		return nil, fmt.Errorf("%w: %w", backend.ErrNotStarted, err)
	}

	waited := p.wait()
	ps, timedOut := backend.Watch(ctx, timeout, waited, func() *os.ProcessState { return p.kill(waited) })
	out.Duration = time.Since(start)
	// Killing init (pid 1 of the sandbox's pid namespace) killed every
	// process in it, so both pipes reach EOF.
	out.Stdout, out.Stderr = waitOutput()
	out.SetExit(ps, timedOut)
	u := p.cg.Usage() // before Destroy removes the cgroup
	out.CPU, out.MemoryPeak, out.OOMKilled = u.CPU, u.MemoryPeak, u.OOMKilled
	if ctx.Err() != nil {
		return out, fmt.Errorf("run cancelled: %w", ctx.Err())
	}
	return out, nil
}

// start lets the program go on: the init's exec, or the hand-over to a
// warm program or to the program's start. A failed hand-over leaves the
// channel open (p.handover) for the caller to close only once it has
// killed the sandbox: closing it first would let a late "ok" run the
// task's code.
func (p *Prepared) start(ctx context.Context) error {
	if h := p.handover; h != nil {
		if err := h.Go(ctx, execWait); err != nil {
			return err
		}
		p.handover = nil
		return nil
	}
	return p.exec(ctx)
}

// execWait bounds the exec signal to the init, which takes well under a
// millisecond when the init waits for it. An init that cannot take it (it
// was stopped, say) would otherwise hold the run before its timeout starts.
const execWait = 5 * time.Second

// exec tells the init to exec the program, within execWait and ctx. On
// failure the caller kills the init, which also ends a pending Exec.
func (p *Prepared) exec(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- p.ctr.Exec() }()
	timer := time.NewTimer(execWait)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("the init did not take the exec signal within %v", execWait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait reaps the init in the background.
func (p *Prepared) wait() <-chan *os.ProcessState {
	p.reaped = true
	waited := make(chan *os.ProcessState, 1)
	go func() {
		ps, _ := p.proc.Wait()
		waited <- ps
	}()
	return waited
}

// Destroy kills whatever still runs in the container and removes it: its
// processes, cgroup, state dir and pipes.
func (p *Prepared) Destroy() error {
	if !p.reaped && p.proc != nil {
		// Never run: its init waits for the exec signal; kill and reap it.
		p.kill(p.wait())
	}
	if p.stdio != nil {
		p.stdio.CloseAll()
	}
	if p.handover != nil {
		p.handover.Close()
		p.handover = nil
	}
	if p.initFD >= 0 {
		unix.Close(p.initFD)
		p.initFD = -1
	}
	if p.mntFD >= 0 {
		unix.Close(p.mntFD)
		p.mntFD = -1
	}
	return destroy(p.stateDir, p.ctr, p.cg)
}

// kill ends the whole sandbox and waits for its init. libcontainer
// signals init only while it looks alive, and a program whose main thread
// ended while others run (a zombie leader) does not: so every process of
// the cgroup is killed, again until init is reaped.
func (p *Prepared) kill(waited <-chan *os.ProcessState) *os.ProcessState {
	// Through the cgroup first: Signal waits for a pending Exec, and that
	// waits for the init to die.
	_ = p.cg.Kill()
	_ = p.ctr.Signal(unix.SIGKILL)
	for {
		select {
		case ps := <-waited:
			return ps
		case <-time.After(100 * time.Millisecond):
		}
		_ = p.cg.Kill()
	}
}

// destroy removes the container (its processes, cgroup and state dir) and
// whatever of its cgroup libcontainer left. The shared cgroup parent stays
// (RemoveCgroupParent).
func destroy(stateDir string, ctr *libcontainer.Container, cg *cgroup.Cgroup) error {
	var errs []error
	if err := ctr.Destroy(); err != nil {
		errs = append(errs, fmt.Errorf("destroying container %s: %w", ctr.ID(), err))
	}
	if err := os.RemoveAll(filepath.Join(stateDir, ctr.ID())); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, cg.Remove())
	return errors.Join(errs...)
}

// RemoveCgroupParent removes the cgroup that holds the backend's runs'
// cgroups, in every hierarchy where it is empty, unless a run's cgroup is
// being made in it right now. Runs keep it: the first one makes it (with
// its cpuset copied from the root's) and every other one finds it, where
// making and removing it took each cold run a few hundred microseconds.
// It is agentrun's own, as the helpers' copies in /run/agentrun/bin are;
// `agentrun gc` removes it.
func (b *Backend) RemoveCgroupParent() error {
	return state.RemoveCgroupParent(b.StateDir, func() error { return cgroup.RemoveEmpty(b.cgroupParent()) })
}

func rlimits(in []specs.POSIXRlimit) ([]configs.Rlimit, error) {
	out := make([]configs.Rlimit, 0, len(in))
	for _, r := range in {
		t, ok := rlimitTypes[r.Type]
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", r.Type)
		}
		out = append(out, configs.Rlimit{Type: t, Soft: r.Soft, Hard: r.Hard})
	}
	return out, nil
}

var rlimitTypes = map[string]int{
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE,
	"RLIMIT_CORE":   unix.RLIMIT_CORE,
	"RLIMIT_FSIZE":  unix.RLIMIT_FSIZE,
	"RLIMIT_NPROC":  unix.RLIMIT_NPROC,
	"RLIMIT_AS":     unix.RLIMIT_AS,
	"RLIMIT_STACK":  unix.RLIMIT_STACK,
	"RLIMIT_CPU":    unix.RLIMIT_CPU,
}
