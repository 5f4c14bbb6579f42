package runapi

import (
	"errors"
	"fmt"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/task"
)

// SandboxRequest is the body of POST /v1/sandboxes: a task's fields but
// its program, and Timeout, the sandbox's lifetime.
type SandboxRequest struct {
	Image   string            `json:"image"`
	Runtime string            `json:"runtime"`
	Limits  config.Limits     `json:"limits"`
	Network task.Network      `json:"network"`
	Env     map[string]string `json:"env"`
	Tools   []string          `json:"tools"`
	Session string            `json:"session"`
	Timeout config.Duration   `json:"timeout"`
}

// SandboxPlan resolves a sandbox's request as a task's (its program the
// sandbox's holder; a session its kept workspace), and its lifetime.
func SandboxPlan(req *SandboxRequest, cfg *config.Config) (*task.Plan, time.Duration, error) {
	switch {
	case req.Session != "" && !task.IsKeptSessionID(req.Session):
		return nil, 0, &Refusal{Why: errkind.Invalid, Field: "session", Msg: fmt.Sprintf("session: %q is not a kept session's id (ss- and 32 hex digits, from POST /v1/sessions)", req.Session)}
	case req.Limits.Timeout.IsSet():
		return nil, 0, &Refusal{Why: errkind.Invalid, Field: "limits.timeout", Msg: "limits.timeout: a sandbox's lifetime is its timeout, and each process's the process's own"}
	}
	lifetime, maxLife := cfg.Sandboxes.DefaultTimeout.Duration(), cfg.Sandboxes.MaxLifetime.Duration()
	if req.Timeout.IsSet() {
		lifetime = req.Timeout.Duration()
		if lifetime > maxLife {
			return nil, 0, &Refusal{Why: errkind.Invalid, Field: "timeout", Msg: fmt.Sprintf("timeout: %s is past the sandboxes' max lifetime %v (sandboxes.max_lifetime)", req.Timeout, maxLife)}
		}
	}
	t := &task.Task{Image: req.Image, Runtime: req.Runtime, Limits: req.Limits, Network: req.Network, Env: req.Env, Tools: req.Tools,
		Session: req.Session, KeepWorkspace: req.Session != "", // its /workspace the session's, kept
		Command: []string{"/bin/sh"}} // replaced by the sandbox's holder
	plan, err := t.Resolve(cfg)
	if err != nil {
		return nil, 0, TaskRefusal(err)
	}
	return plan, lifetime, nil
}

// TaskRefusal is the refusal of a task that does not load: 400, or 403
// above policy, naming the field at fault.
func TaskRefusal(err error) *Refusal {
	field := ""
	var te *task.Error
	if errors.As(err, &te) {
		field = te.Field
	}
	return &Refusal{Why: errkind.Or(err, errkind.Invalid), Field: field, Msg: err.Error()}
}
