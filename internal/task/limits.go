package task

import (
	"errors"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
)

// resolveLimits takes each limit from the task, else from the config, and
// refuses any above the config's policy (errkind.ErrPolicy), never
// clamping (config.Limits.Resolve).
func resolveLimits(tl config.Limits, cfg *config.Config) (Limits, error) {
	l, err := tl.Resolve(cfg.Limits, cfg.Policy.Limits)
	var le *config.LimitError
	switch {
	case err == nil:
		return l, nil
	case !errors.As(err, &le) || !strings.HasPrefix(le.Field, "limits."):
		return Limits{}, errors.New("config " + err.Error()) // only an invalid config lacks a maximum
	case le.Policy:
		return Limits{}, &Error{Field: le.Field, Reason: le.Reason, Err: errkind.ErrPolicy}
	}
	return Limits{}, &Error{Field: le.Field, Reason: le.Reason}
}
