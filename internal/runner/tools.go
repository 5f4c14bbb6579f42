package runner

import (
	_ "embed"
	"fmt"
	"path/filepath"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/toolbroker"
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
		CgroupParent: r.cfg.ToolsCgroupParent(), CgroupLockDir: toolsDir(r.cfg), Shared: r.sharedTools,
		Count: req.toolCount, Logf: r.logf,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the tool broker: %w", err)
	}
	return b, nil
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

// toolsDir is the state dir of the tool servers: their cgroup-parent
// lock.
func toolsDir(cfg *config.Config) string { return filepath.Join(cfg.StateDir, "tools") }

// logf is r.Logf, or nothing.
func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}
