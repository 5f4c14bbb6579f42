package task

import (
	"fmt"
	"math"
	"strconv"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
)

// resolveLimits takes each limit of config.LimitTable from the task, else
// from the config, and refuses any above the config's policy (errkind.ErrPolicy),
// never clamping.
func resolveLimits(tl config.Limits, cfg *config.Config) (Limits, error) {
	def, pol := cfg.Limits, cfg.Policy
	var l Limits
	for _, lim := range config.LimitTable {
		if !lim.Text() {
			continue
		}
		n, err := resolveOne(lim.Name, lim.Of(&tl).String(), lim.Of(&def).String(), lim.Of(&pol).String(), lim.Parse)
		if err != nil {
			return Limits{}, err
		}
		lim.Of(&l).SetInt(n)
	}
	// Below these a sandbox cannot even start: say so, naming the field,
	// rather than fail later in the kernel's words.
	for _, lim := range config.LimitTable {
		if v := lim.Of(&l); lim.Min > 0 && v.Int() < lim.Min {
			return Limits{}, errorf("limits."+lim.Name, "%d bytes is below the minimum %d", v.Int(), lim.Min)
		}
	}
	// /tmp is a tmpfs: what is written there is the sandbox's memory, so a
	// /tmp larger than the memory limit ends in an OOM kill when filled,
	// not in "no space left". A task asking for that is refused; a default
	// tmp_size above the task's memory is lowered to it.
	if l.TmpSize > l.Memory {
		if tl.TmpSize != "" {
			return Limits{}, errorf("limits.tmp_size", "%d bytes is above limits.memory (%d bytes): /tmp is held in the sandbox's memory, so filling it would end in an OOM kill; lower tmp_size or raise memory", l.TmpSize, l.Memory)
		}
		l.TmpSize = l.Memory
	}
	for _, lim := range config.LimitTable {
		switch lim.Unit {
		case config.Cores:
			x, err := resolveNum(lim.Name, lim.Of(&tl).Interface().(*float64), lim.Of(&def).Interface().(*float64), lim.Of(&pol).Interface().(*float64))
			if err != nil {
				return Limits{}, err
			}
			lim.Of(&l).SetFloat(x)
		case config.Count:
			n, err := resolveNum(lim.Name, lim.Of(&tl).Interface().(*int64), lim.Of(&def).Interface().(*int64), lim.Of(&pol).Interface().(*int64))
			if err != nil {
				return Limits{}, err
			}
			lim.Of(&l).SetInt(n)
		}
	}
	return l, nil
}

// resolveOne resolves a string-valued limit (duration or size).
func resolveOne(name, val, def, max string, parse func(string) (int64, error)) (int64, error) {
	field := "limits." + name
	maxN, err := parse(max)
	if err != nil {
		return 0, fmt.Errorf("config policy.%s: %w", name, err)
	}
	shown := val
	if val == "" {
		if shown = def; def == "" {
			return 0, fmt.Errorf("config limits.%s: no default", name)
		}
	}
	n, err := parse(shown)
	switch {
	case err != nil && val == "":
		return 0, fmt.Errorf("config limits.%s: %w", name, err)
	case err != nil:
		return 0, errorf(field, "%v", err)
	case n <= 0:
		return 0, errorf(field, "%q must be greater than zero", shown)
	case n > maxN:
		return 0, &Error{Field: field, Reason: fmt.Sprintf("%s exceeds policy maximum %s", shown, max), Err: errkind.ErrPolicy}
	}
	return n, nil
}

// resolveNum resolves a numeric limit.
func resolveNum[T int64 | float64](name string, val, def, max *T) (T, error) {
	field := "limits." + name
	if max == nil {
		return 0, fmt.Errorf("config policy.%s: not set", name)
	}
	v := val
	if v == nil {
		if v = def; v == nil {
			return 0, fmt.Errorf("config limits.%s: no default", name)
		}
	}
	switch {
	case !(*v > 0) || math.IsInf(float64(*v), 0):
		return 0, errorf(field, "%s must be greater than zero", format(*v))
	case *v > *max:
		return 0, &Error{Field: field, Reason: fmt.Sprintf("%s exceeds policy maximum %s", format(*v), format(*max)), Err: errkind.ErrPolicy}
	}
	return *v, nil
}

func format[T int64 | float64](v T) string {
	if f, ok := any(v).(float64); ok {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strconv.FormatInt(int64(v), 10)
}
