package runc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // device rules for the cgroup manager
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	"github.com/opencontainers/cgroups/fscommon"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/backend"
)

// Backend runs containers with libcontainer. Its zero value is not usable:
// StateDir must be set.
type Backend struct {
	// StateDir holds libcontainer's per-container state (e.g. /run/agentrun/runc).
	StateDir string
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
// container's init waits for the exec of the program, so it can be pooled.
func (b *Backend) Traits() backend.Traits {
	return backend.Traits{CgroupParent: CgroupParent, Poolable: true}
}

// CgroupParent holds the cgroups of libcontainer runs.
const CgroupParent = "/agentrun"

// Run creates the container, runs its program to the end or to the timeout,
// collects its output and usage, and destroys it.
func (b *Backend) Run(ctx context.Context, c *backend.Container) (*backend.Outcome, error) {
	return backend.Run(ctx, b, c)
}

// Prepared is a container whose init has done all of its set-up
// (namespaces, cgroup, mounts, pivot_root) and waits to exec the program.
// Its program runs once, by Run; Destroy removes it, run or not.
type Prepared struct {
	stateDir string
	ctr      *libcontainer.Container
	cg       *cgroups.Cgroup
	paths    map[string]string
	stdio    *backend.Pipes
	proc     *libcontainer.Process
	reaped   bool // the init has been waited for
	idle     bool // its cgroup is idle for the CPU scheduler until Run
}

// Prepare creates c's container and starts its init, which stops just
// before the exec of the program. c's Stdin, Timeout and OutputLimit are
// not used: Run takes them. On error nothing is left behind.
func (b *Backend) Prepare(_ context.Context, c *backend.Container) (_ backend.Prepared, err error) {
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   c.ID,
		Spec:         c.Spec,
		NoNewKeyring: true,
	})
	if err != nil {
		return nil, fmt.Errorf("converting spec: %w", err)
	}
	rlimits, err := rlimits(c.Spec.Process.Rlimits)
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
	p := &Prepared{stateDir: b.StateDir, ctr: ctr, cg: cfg.Cgroups}
	// The cgroup paths are known from Create on; a copy, since the map is
	// the cgroup manager's own, which Destroy empties.
	if st, serr := ctr.State(); serr == nil {
		p.paths = maps.Clone(st.CgroupPaths)
	}
	undo.Add(p.Destroy)
	// Destroy removes the shared parent cgroup once it is empty, under the
	// lock held here: it is released first.
	undo.Add(func() error { unlock(); return nil })

	if p.stdio, err = backend.NewPipes(); err != nil {
		return nil, err
	}
	if c.Ahead {
		// Made ahead of demand: the init's set-up runs on CPU time that
		// runs leave free, and Run makes the cgroup ordinary again.
		if p.idle, err = setIdle(p.cg, p.paths, true); err != nil {
			return nil, err
		}
	}
	nnp := true
	p.proc = &libcontainer.Process{
		Args:            c.Spec.Process.Args,
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
	}
	if err := ctr.Start(p.proc); err != nil {
		return nil, fmt.Errorf("starting container: %w", err)
	}
	p.stdio.CloseChildEnds()
	// The cgroup exists from Start on and the program waits for Run: its
	// socket buffers are capped before it can open a socket.
	if m := c.Spec.Linux.Resources.Memory; m != nil && m.Limit != nil && !cgroups.IsCgroup2UnifiedMode() {
		if _, err := backend.ChargeSocketMemory(p.paths["memory"], *m.Limit); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ID is the container's ID.
func (p *Prepared) ID() string { return p.ctr.ID() }

// Ready reports whether the init still waits to exec the program.
func (p *Prepared) Ready() bool {
	if p.reaped {
		return false
	}
	st, err := p.ctr.Status()
	return err == nil && st == libcontainer.Created
}

// Run lets the program exec, feeds it stdin, and waits for it to end or for
// the timeout (or ctx) to kill the sandbox; output, if not nil, gets the
// kept output as it arrives. It may be called once.
func (p *Prepared) Run(ctx context.Context, stdin []byte, timeout time.Duration, outputLimit int64, output backend.OutputFunc) (out *backend.Outcome, err error) {
	if p.reaped {
		return nil, errors.New("container already ran")
	}
	out = &backend.Outcome{}
	start := time.Now()
	waitOutput := p.stdio.Serve(stdin, outputLimit, output)
	if p.idle {
		// The program runs with the ordinary share of the CPU.
		_, err = setIdle(p.cg, p.paths, false)
	}
	if err == nil {
		err = p.exec(ctx)
	}
	if err != nil {
		// The pipes reach EOF once the init is gone.
		p.kill(p.wait())
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
	usage(p.paths, out)
	if ctx.Err() != nil {
		return out, fmt.Errorf("run cancelled: %w", ctx.Err())
	}
	return out, nil
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
	return destroy(p.stateDir, p.ctr, p.paths)
}

// kill ends the whole sandbox and waits for its init. libcontainer
// signals init only while it looks alive, and a program whose main thread
// ended while others run (a zombie leader) does not: so every process of
// the cgroup is killed too, again until init is reaped.
func (p *Prepared) kill(waited <-chan *os.ProcessState) *os.ProcessState {
	// Through the cgroup first: Signal waits for a pending Exec, and that
	// waits for the init to die.
	m, err := manager.NewWithPaths(p.cg, p.paths)
	if err == nil {
		killAll(m)
	}
	_ = p.ctr.Signal(unix.SIGKILL)
	for {
		if err == nil {
			killAll(m)
		}
		select {
		case ps := <-waited:
			return ps
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// usage reads cpu time, peak memory and the OOM-kill count from the run's
// cgroup before it is destroyed: three files, not the statistics of every
// controller.
func usage(paths map[string]string, out *backend.Outcome) {
	if paths == nil {
		return
	}
	var cpu, peak, ooms uint64
	if cgroups.IsCgroup2UnifiedMode() {
		dir := paths[""]
		if usec, err := fscommon.GetValueByKey(dir, "cpu.stat", "usage_usec"); err == nil {
			cpu = usec * 1000
		}
		peak, _ = fscommon.GetCgroupParamUint(dir, "memory.peak") // kernel 5.19 and later
		ooms, _ = fscommon.GetValueByKey(dir, "memory.events", "oom_kill")
	} else {
		cpu, _ = fscommon.GetCgroupParamUint(paths["cpuacct"], "cpuacct.usage")
		peak, _ = fscommon.GetCgroupParamUint(paths["memory"], "memory.max_usage_in_bytes")
		// v1 keeps socket buffers apart (v2's memory.peak has them).
		tcp, _ := fscommon.GetCgroupParamUint(paths["memory"], "memory.kmem.tcp.max_usage_in_bytes")
		peak += tcp
		ooms, _ = fs.OOMKillCount(paths["memory"])
	}
	out.CPU = time.Duration(cpu)
	out.MemoryPeak = int64(peak)
	out.OOMKilled = ooms > 0
}

// destroy removes the container (its processes, cgroup and state dir) and
// the shared cgroup parents once no other run uses them.
func destroy(stateDir string, ctr *libcontainer.Container, paths map[string]string) error {
	var errs []error
	if err := ctr.Destroy(); err != nil {
		errs = append(errs, fmt.Errorf("destroying container %s: %w", ctr.ID(), err))
	}
	if err := os.RemoveAll(filepath.Join(stateDir, ctr.ID())); err != nil {
		errs = append(errs, err)
	}
	removeParents(stateDir, paths)
	return errors.Join(errs...)
}

// removeParents removes the shared "agentrun" parent of each cgroup path
// once it is empty, unless another run is being created right now.
func removeParents(stateDir string, paths map[string]string) {
	unlock, err := state.LockCgroupParent(stateDir, true)
	if err != nil {
		return
	}
	defer unlock()
	for _, p := range paths {
		if parent := filepath.Dir(p); filepath.Base(parent) == "agentrun" {
			_ = os.Remove(parent) // fails while another run's cgroup is in it
		}
	}
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

// setIdle makes the container's cgroup idle for the CPU scheduler (cpu.idle,
// Linux 5.15 and later: its processes run only on CPU time that nothing
// else wants), or ordinary again. Making it idle creates the cgroup ahead
// of libcontainer (which joins it), so that the init is idle from its
// start. It reports whether the cgroup is idle: false, without an error,
// when the kernel has no cpu.idle or there is no cpu controller.
func setIdle(cg *cgroups.Cgroup, paths map[string]string, idle bool) (bool, error) {
	dir := paths["cpu"]
	if cgroups.IsCgroup2UnifiedMode() {
		dir = paths[""]
	}
	if dir == "" {
		return false, nil
	}
	if idle {
		var err error
		if cgroups.IsCgroup2UnifiedMode() {
			err = fs2.CreateCgroupPath(dir, cg)
		} else {
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil {
			return false, fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
	}
	v := "0"
	if idle {
		v = "1"
	}
	if err := cgroups.WriteFile(dir, "cpu.idle", v); err != nil {
		if errors.Is(err, os.ErrNotExist) && idle {
			return false, nil
		}
		return false, fmt.Errorf("setting cpu.idle of %s: %w", dir, err)
	}
	return idle, nil
}
