// Package compose puts agentrun's machinery together from a config: it
// chooses the runtimes the host offers (runtime/runc, and runtime/runsc
// where runsc can run) and hands them to the runner, and hands doctor the
// same machinery to try the host with (Doctor). No package but this one
// and cmd/agentrun depends on a backend, and doctor wires no
// libcontainer or netlink of its own (the tests of this package say so);
// cmd/agentrun and the root tests open their runners here.
package compose

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/runc"
	"github.com/agentrun/agentrun/runtime/runsc"
)

// Runner opens a runner on cfg with the host's runtimes (Runtimes); it
// writes its audit records to log (nil: none).
func Runner(cfg *config.Config, log *audit.Log) (*runner.Runner, error) {
	rts, err := Runtimes(cfg)
	if err != nil {
		return nil, err
	}
	return runner.New(cfg, log, rts...)
}

// Runtimes makes the host's runtimes for cfg: libcontainer's, its seccomp
// helper (SeccompHelper) staged where sandboxes bind it from
// (runner.StageBinary); and runsc's, or, where runsc cannot run, why not,
// with what still removes the runs it left.
func Runtimes(cfg *config.Config) ([]backend.Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, runner.ErrNotRoot
	}
	// The state dir first, as the runner makes its own there: a full or
	// unwritable one is refused as such, before any backend's part of it.
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	lc, err := runc.New(filepath.Join(cfg.StateDir, "runc"))
	if err != nil {
		return nil, err
	}
	lc.SeccompCache = filepath.Join(cfg.StateDir, "seccomp")
	lc.CgroupParent = cfg.CgroupParent
	if lc.SeccompHelper, err = SeccompHelper(cfg); err != nil {
		return nil, err
	}
	if lc.SeccompHelper != "" {
		if lc.SeccompHelper, err = runner.StageBinary(lc.SeccompHelper, runc.SeccompHelper); err != nil {
			return nil, fmt.Errorf("the seccomp helper: %w", err)
		}
	}
	rts := []backend.Runtime{{Name: config.RuntimeLibcontainer, Backend: lc}}
	runscDir := filepath.Join(cfg.StateDir, "runsc")
	sc, err := runsc.New(cfg.Runsc.Path, cfg.Runsc.Flags, runscDir, cfg.RunscCgroupParent())
	if err != nil {
		return append(rts, backend.Runtime{Name: config.RuntimeRunsc, Missing: err,
			Leftovers: runsc.Leftovers(runscDir, cfg.RunscCgroupParent())}), nil
	}
	return append(rts, backend.Runtime{Name: config.RuntimeRunsc, Backend: sc}), nil
}

// SeccompHelper is the agentrun-seccomp that config key seccomp_helper
// names: for "" the one beside the binary or in ../lib/agentrun from it
// (runc.FindSeccompHelper), if any; for "off" none; else the path, which
// must pass runc.CheckSeccompHelper. "" means libcontainer compiles the
// filter in every container's init.
func SeccompHelper(cfg *config.Config) (string, error) {
	switch cfg.SeccompHelper {
	case "":
		return runc.FindSeccompHelper(), nil
	case config.SeccompHelperOff:
		return "", nil
	}
	if err := runc.CheckSeccompHelper(cfg.SeccompHelper); err != nil {
		return "", fmt.Errorf("%w (make build puts it in bin/; or set config key seccomp_helper to \"\")", err)
	}
	return cfg.SeccompHelper, nil
}
