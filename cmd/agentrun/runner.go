package main

import (
	"errors"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
)

// openRunner opens the audit log at auditPath and a runner on cfg, then
// removes what dead runs left (a gc failure is logged with logf, not
// fatal); the runner logs with logf too. closeLog closes the runner (its
// shared tool servers) and then the log, once no run is in progress.
func openRunner(cfg *config.Config, auditPath string, logf func(string, ...any)) (r *runner.Runner, closeLog func() error, err error) {
	log, err := audit.Open(auditPath)
	if err != nil {
		return nil, nil, err
	}
	if r, err = compose.Runner(cfg, log); err != nil {
		log.Close()
		return nil, nil, err
	}
	r.Logf = logf
	if _, err := r.GC(); err != nil {
		logf("gc: %v", err)
	}
	return r, func() error { return errors.Join(r.Close(), log.Close()) }, nil
}

// longLived readies r for a long-running command before its first run:
// it compiles the sandbox's seccomp filter, and logs it when every
// container's init will compile it instead (a few milliseconds of CPU per
// run), and has r make the run launcher's bytecode for the images its
// Python runs use.
func longLived(r *runner.Runner, logf func(string, ...any)) {
	if err := r.PrecompiledSeccomp(); err != nil {
		logf("the seccomp filter is compiled in every container's init: %v", err)
	}
	r.MakeLauncherCode()
}
