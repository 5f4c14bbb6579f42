package task

import (
	"fmt"
	"math"
	"strconv"

	"github.com/agentrun/agentrun/internal/config"
)

// resolveLimits takes each limit from the task, else from the config, and
// refuses any above the config's policy (ErrPolicy), never clamping.
// Smallest limits a sandbox can run with.
const (
	MinMemory = 8 << 20 // the container's own init and a small program
	MinSize   = 64 << 10
)

func resolveLimits(tl config.Limits, cfg *config.Config) (Limits, error) {
	def, pol := cfg.Limits, cfg.Policy
	var l Limits
	var err error
	dur := func(s string) (int64, error) { d, err := config.ParseDuration(s); return int64(d), err }
	for _, f := range []struct {
		name          string
		val, def, max string
		parse         func(string) (int64, error)
		dst           *int64
	}{
		{"timeout", tl.Timeout, def.Timeout, pol.Timeout, dur, (*int64)(&l.Timeout)},
		{"memory", tl.Memory, def.Memory, pol.Memory, config.ParseSize, &l.Memory},
		{"tmp_size", tl.TmpSize, def.TmpSize, pol.TmpSize, config.ParseSize, &l.TmpSize},
		{"workspace_size", tl.WorkspaceSize, def.WorkspaceSize, pol.WorkspaceSize, config.ParseSize, &l.WorkspaceSize},
		{"net_bytes", tl.NetBytes, def.NetBytes, pol.NetBytes, config.ParseSize, &l.NetBytes},
	} {
		if *f.dst, err = resolveOne(f.name, f.val, f.def, f.max, f.parse); err != nil {
			return Limits{}, err
		}
	}
	// Below these a sandbox cannot even start: say so, naming the field,
	// rather than fail later in the kernel's words.
	for _, f := range []struct {
		name string
		val  int64
		min  int64
	}{{"memory", l.Memory, MinMemory}, {"tmp_size", l.TmpSize, MinSize}, {"workspace_size", l.WorkspaceSize, MinSize}} {
		if f.val < f.min {
			return Limits{}, errorf("limits."+f.name, "%d bytes is below the minimum %d", f.val, f.min)
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
	if l.CPUs, err = resolveNum("cpus", tl.CPUs, def.CPUs, pol.CPUs); err != nil {
		return Limits{}, err
	}
	for _, f := range []struct {
		name          string
		val, def, max *int64
		dst           *int64
	}{
		{"pids", tl.Pids, def.Pids, pol.Pids, &l.Pids},
		{"output_bytes", tl.OutputBytes, def.OutputBytes, pol.OutputBytes, &l.OutputBytes},
		{"net_connections", tl.NetConns, def.NetConns, pol.NetConns, &l.NetConns},
	} {
		if *f.dst, err = resolveNum(f.name, f.val, f.def, f.max); err != nil {
			return Limits{}, err
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
		return 0, &Error{Field: field, Reason: fmt.Sprintf("%s exceeds policy maximum %s", shown, max), Err: ErrPolicy}
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
		return 0, &Error{Field: field, Reason: fmt.Sprintf("%s exceeds policy maximum %s", format(*v), format(*max)), Err: ErrPolicy}
	}
	return *v, nil
}

func format[T int64 | float64](v T) string {
	if f, ok := any(v).(float64); ok {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strconv.FormatInt(int64(v), 10)
}
