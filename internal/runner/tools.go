package runner

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/toolbroker"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// toolsModule is the source of agentrun_tools, the Python module a run
// with tools imports to call them: agentrun's own, mounted read-only.
//
//go:embed agentrun_tools.py
var toolsModule []byte

// ToolsModuleDir is where a run with tools finds agentrun_tools.py,
// first on its PYTHONPATH: in the sandbox's /dev tmpfs, as the launchers,
// from the run's etc tmpfs, so that its mountinfo names no host path.
const ToolsModuleDir = "/dev/agentrun-python"

// toolBroker makes the broker of req's run, which names tools: the
// config's servers, bounds and approval timeout, its held calls decided
// as its held requests are, its calls counted by req.toolCount.
func (r *Runner) toolBroker(req request) (*toolbroker.Broker, error) {
	servers, err := toolbroker.ServersFromConfig(r.cfg, req.plan.Tools)
	if err != nil {
		return nil, err
	}
	b, err := toolbroker.New(toolbroker.Options{
		Run: req.id, Servers: servers, Limits: toolbroker.LimitsFromConfig(r.cfg),
		Approve: req.approve, ApprovalTimeout: r.cfg.Network.ApprovalTimeout.Duration(),
		CgroupParent: r.cfg.ToolsCgroupParent(), Shared: r.sharedTools,
		Count: req.toolCount, Logf: r.logf,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the tool broker: %w", err)
	}
	return b, nil
}

// enterToolsParent takes, for a run with tools, the shared lock of the
// cgroup parent its stdio servers' cgroups are made in
// (Config.ToolsCgroupParent), as a backend's runs do theirs, and returns
// leave: it lets the lock go and removes the parent where it is then
// empty and no other run with tools holds the lock (the last one out
// removes it). leave may be called more than once.
func (r *Runner) enterToolsParent() (leave func(), err error) {
	dir, err := r.toolsStateDir()
	if err != nil {
		return nil, err
	}
	unlock, err := state.LockCgroupParent(dir, false)
	if err != nil {
		return nil, fmt.Errorf("tool servers' cgroup parent: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			unlock()
			r.removeToolsParent()
		})
	}, nil
}

// toolsStateDir is the state dir of the tool servers' cgroup-parent
// lock, made if it is not there.
func (r *Runner) toolsStateDir() (string, error) {
	dir := filepath.Join(r.cfg.StateDir, "tools")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("the tool servers' state dir: %w", err)
	}
	return dir, nil
}

// removeToolsParent removes the tool servers' cgroup parent in every
// hierarchy where it is empty, unless a run with tools holds its lock
// or a shared server's cgroup is in it.
func (r *Runner) removeToolsParent() {
	dir, err := r.toolsStateDir()
	if err != nil {
		return
	}
	unlock, err := state.LockCgroupParent(dir, true)
	if err != nil {
		return // another run with tools is live: it removes the parent
	}
	defer unlock()
	// RemoveParent of a cgroup in the parent removes the parent alone,
	// and only where it is empty.
	if cg, err := cgroup.Open(r.cfg.ToolsCgroupParent() + "/-"); err == nil {
		cg.RemoveParent()
	}
}

// cleanToolCgroups kills every process of the stdio tool servers'
// cgroups of run id, which is dead, and removes them, then the tools'
// cgroup parent if that leaves it empty. A server's process dies with
// the agentrun that started it (Pdeathsig); its cgroup stays until now.
func (r *Runner) cleanToolCgroups(id string) error {
	parent := r.cfg.ToolsCgroupParent()
	names := map[string]bool{}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/*"} {
		dirs, _ := filepath.Glob(filepath.Join(root, parent, "tool-"+id+"-*"))
		for _, d := range dirs {
			names[filepath.Base(d)] = true
		}
	}
	var errs []error
	for name := range names {
		cg, err := cgroup.Open(parent + "/" + name)
		if err == nil {
			err = errors.Join(cg.Kill(), cg.Remove())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tool server cgroup %s: %w", name, err))
		}
	}
	if len(names) > 0 {
		r.removeToolsParent()
	}
	return errors.Join(errs...)
}

// toolsModuleOpts mounts agentrun_tools in ToolsModuleDir, read-only, and
// puts the directory first on PYTHONPATH (before any the task gives).
func toolsModuleOpts(dir string, undo *cleanup.Cleanup) ([]spec.SpecOpt, error) {
	path, err := writeEtc(dir, undo, "python/agentrun_tools.py", toolsModule)
	if err != nil {
		return nil, fmt.Errorf("writing agentrun_tools: %w", err)
	}
	return []spec.SpecOpt{
		spec.WithReadonlyFile(path, ToolsModuleDir+"/agentrun_tools.py"),
		spec.WithEnvListFirst("PYTHONPATH", ToolsModuleDir),
	}, nil
}

// logf is r.Logf, or nothing.
func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}
