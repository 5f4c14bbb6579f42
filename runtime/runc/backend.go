package runc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	_ "github.com/opencontainers/cgroups/devices" // device rules for the cgroup manager
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime"
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

// Run creates the container, runs its program to the end or to the timeout,
// collects its output and usage, and destroys it.
func (b *Backend) Run(ctx context.Context, c *runtime.Container) (out *runtime.Outcome, err error) {
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

	unlock, err := runtime.LockCgroupParent(b.StateDir, false)
	if err != nil {
		return nil, err
	}
	ctr, err := libcontainer.Create(b.StateDir, c.ID, cfg)
	if err != nil {
		unlock()
		// Create may leave a state dir without state.json behind.
		_ = os.RemoveAll(filepath.Join(b.StateDir, c.ID))
		return nil, fmt.Errorf("creating container: %w", err)
	}
	// The cgroup paths are known from Create on; a copy, since the map is
	// the cgroup manager's own, which Destroy empties.
	var paths map[string]string
	if st, serr := ctr.State(); serr == nil {
		paths = maps.Clone(st.CgroupPaths)
	}
	defer func() {
		if derr := destroy(b.StateDir, ctr, paths); derr != nil && err == nil {
			err = derr
		}
	}()

	stdio, err := runtime.NewPipes()
	if err != nil {
		unlock()
		return nil, err
	}
	defer stdio.CloseAll()

	nnp := true
	proc := &libcontainer.Process{
		Args:            c.Spec.Process.Args,
		Env:             c.Spec.Process.Env,
		Cwd:             c.Spec.Process.Cwd,
		UID:             int(c.Spec.Process.User.UID),
		GID:             int(c.Spec.Process.User.GID),
		Stdin:           stdio.InR,
		Stdout:          stdio.OutW,
		Stderr:          stdio.ErrW,
		NoNewPrivileges: &nnp,
		Rlimits:         rlimits,
		Init:            true,
	}
	start := time.Now()
	err = ctr.Run(proc)
	unlock()
	if err != nil {
		return nil, fmt.Errorf("starting container: %w", err)
	}
	stdio.CloseChildEnds()

	out = &runtime.Outcome{}
	waitOutput := stdio.Serve(c.Stdin, c.OutputLimit)

	waited := make(chan *os.ProcessState, 1)
	go func() {
		ps, _ := proc.Wait()
		waited <- ps
	}()
	timer := time.NewTimer(c.Timeout)
	defer timer.Stop()
	var ps *os.ProcessState
	select {
	case ps = <-waited:
	case <-timer.C:
		out.TimedOut = true
		ps = kill(ctr, cfg.Cgroups, paths, waited)
	case <-ctx.Done():
		ps = kill(ctr, cfg.Cgroups, paths, waited)
	}
	out.Duration = time.Since(start)
	// Killing init (pid 1 of the sandbox's pid namespace) killed every
	// process in it, so both pipes reach EOF.
	out.Stdout, out.Stderr = waitOutput()

	if ps != nil {
		ws := ps.Sys().(syscall.WaitStatus)
		switch {
		case ws.Signaled():
			out.ExitCode = 128 + int(ws.Signal())
			out.Signal = unix.SignalName(ws.Signal())
		default:
			out.ExitCode = ws.ExitStatus()
		}
	}
	usage(ctr, cfg.Cgroups, paths, out)
	if ctx.Err() != nil {
		return out, fmt.Errorf("run cancelled: %w", ctx.Err())
	}
	return out, nil
}

// kill ends the whole sandbox and waits for its init. libcontainer
// signals init only while it looks alive, and a program whose main thread
// ended while others run (a zombie leader) does not: so every process of
// the cgroup is killed too, again until init is reaped.
func kill(ctr *libcontainer.Container, cg *cgroups.Cgroup, paths map[string]string, waited <-chan *os.ProcessState) *os.ProcessState {
	_ = ctr.Signal(unix.SIGKILL)
	m, err := manager.NewWithPaths(cg, paths)
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

// usage reads cpu, peak memory and the OOM-kill count from the run's cgroup
// before it is destroyed.
func usage(ctr *libcontainer.Container, cg *cgroups.Cgroup, paths map[string]string, out *runtime.Outcome) {
	if st, err := ctr.Stats(); err == nil && st.CgroupStats != nil {
		out.CPU = time.Duration(st.CgroupStats.CpuStats.CpuUsage.TotalUsage)
		out.MemoryPeak = int64(st.CgroupStats.MemoryStats.Usage.MaxUsage)
	}
	if paths == nil {
		return
	}
	if m, err := manager.NewWithPaths(cg, paths); err == nil {
		if n, err := m.OOMKillCount(); err == nil && n > 0 {
			out.OOMKilled = true
		}
	}
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
	unlock, err := runtime.LockCgroupParent(stateDir, true)
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
