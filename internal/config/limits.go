package config

import (
	"fmt"
	"strconv"
	"time"
)

// Limits are resource limits as JSON writes them: a task's "limits", the
// config's "limits" (the defaults) and its "policy" (the maxima). An
// absent limit is unset (a nil pointer, an unset Duration or Size).
//
// A limit is one field here and one in Resolved, a line of Resolve, its
// default and maximum in Default, its row of LimitTable, and its place in
// the sandbox (runner.SandboxSpec, or the run or its proxy), the pool's
// shape key and the audit record.
type Limits struct {
	Timeout       Duration `json:"timeout,omitzero"`          // e.g. "5s"
	Memory        Size     `json:"memory,omitzero"`           // e.g. "256m" (binary units: k,m,g; plain number = bytes)
	CPUs          *float64 `json:"cpus,omitempty"`            // CPU cores, fractional
	Pids          *int64   `json:"pids,omitempty"`            // processes and threads
	OutputBytes   *int64   `json:"output_bytes,omitempty"`    // bytes kept per output stream
	TmpSize       Size     `json:"tmp_size,omitzero"`         // size of the /tmp tmpfs
	WorkspaceSize Size     `json:"workspace_size,omitzero"`   // size of the /workspace tmpfs
	NetBytes      Size     `json:"net_bytes,omitzero"`        // bytes per run per direction through the proxy
	NetConns      *int64   `json:"net_connections,omitempty"` // connections at once through the proxy
}

// Resolved are limits with every value chosen and checked (package task's
// Limits): sizes in bytes. The JSON names are the limits' names.
type Resolved struct {
	Timeout       time.Duration `json:"timeout"`
	Memory        int64         `json:"memory"`
	TmpSize       int64         `json:"tmp_size"`
	WorkspaceSize int64         `json:"workspace_size"`
	NetBytes      int64         `json:"net_bytes"` // per run per direction through the proxy
	CPUs          float64       `json:"cpus"`
	Pids          int64         `json:"pids"`
	OutputBytes   int64         `json:"output_bytes"` // kept per output stream
	NetConns      int64         `json:"net_connections"`
}

// The smallest values a sandbox can run with.
const (
	MinMemory        = 8 << 20 // the init and a small program
	MinTmpSize       = 64 << 10
	MinWorkspaceSize = 64 << 10
)

// LimitError is a limit that cannot be resolved. Field is its key
// ("limits.memory", or "policy.memory" for a maximum); Policy: it asks for
// more than the policy allows.
type LimitError struct {
	Field, Reason string
	Policy        bool
}

func (e *LimitError) Error() string { return e.Field + ": " + e.Reason }

// Resolve takes each limit from l (a task's), else from def (the config's
// defaults), refusing one not above zero or above max's (Policy), never
// clamping; then the minimums, and /tmp within memory: /tmp is a tmpfs,
// held in the sandbox's memory, so a /tmp larger than the memory limit
// would end in an OOM kill when filled, not in "no space left". l asking
// for that is refused; a default tmp_size above memory is lowered to it.
// Errors are *LimitError.
func (l Limits) Resolve(def, max Limits) (Resolved, error) {
	r, err := l.pick(def, max)
	if err != nil {
		return Resolved{}, err
	}
	// Below these a sandbox cannot even start: say so, naming the field,
	// rather than fail later in the kernel's words.
	for _, m := range []struct {
		name     string
		val, min int64
	}{{"memory", r.Memory, MinMemory}, {"tmp_size", r.TmpSize, MinTmpSize}, {"workspace_size", r.WorkspaceSize, MinWorkspaceSize}} {
		if m.val < m.min {
			return Resolved{}, &LimitError{Field: "limits." + m.name, Reason: fmt.Sprintf("%d bytes is below the minimum %d", m.val, m.min)}
		}
	}
	if r.TmpSize > r.Memory {
		if l.TmpSize.IsSet() {
			return Resolved{}, &LimitError{Field: "limits.tmp_size", Reason: fmt.Sprintf("%d bytes is above limits.memory (%d bytes): /tmp is held in the sandbox's memory, so filling it would end in an OOM kill; lower tmp_size or raise memory", r.TmpSize, r.Memory)}
		}
		r.TmpSize = r.Memory
	}
	return r, nil
}

// pick takes each limit from l, else from def, and checks it against max.
func (l Limits) pick(def, max Limits) (Resolved, error) {
	var r Resolved
	var err error
	take(&err, &r.Timeout, "timeout", l.Timeout.ptr(), def.Timeout.ptr(), max.Timeout.ptr(), Duration.Duration, Duration.String)
	take(&err, &r.Memory, "memory", l.Memory.ptr(), def.Memory.ptr(), max.Memory.ptr(), Size.Bytes, Size.String)
	take(&err, &r.TmpSize, "tmp_size", l.TmpSize.ptr(), def.TmpSize.ptr(), max.TmpSize.ptr(), Size.Bytes, Size.String)
	take(&err, &r.WorkspaceSize, "workspace_size", l.WorkspaceSize.ptr(), def.WorkspaceSize.ptr(), max.WorkspaceSize.ptr(), Size.Bytes, Size.String)
	take(&err, &r.NetBytes, "net_bytes", l.NetBytes.ptr(), def.NetBytes.ptr(), max.NetBytes.ptr(), Size.Bytes, Size.String)
	take(&err, &r.CPUs, "cpus", l.CPUs, def.CPUs, max.CPUs, same, formatFloat)
	take(&err, &r.Pids, "pids", l.Pids, def.Pids, max.Pids, same, formatInt)
	take(&err, &r.OutputBytes, "output_bytes", l.OutputBytes, def.OutputBytes, max.OutputBytes, same, formatInt)
	take(&err, &r.NetConns, "net_connections", l.NetConns, def.NetConns, max.NetConns, same, formatInt)
	return r, err
}

// checkMaxima checks that every limit of a policy is set and above zero.
func (l Limits) checkMaxima() error {
	var err error
	maxOf(&err, "timeout", l.Timeout.ptr(), Duration.Duration, Duration.String)
	maxOf(&err, "memory", l.Memory.ptr(), Size.Bytes, Size.String)
	maxOf(&err, "tmp_size", l.TmpSize.ptr(), Size.Bytes, Size.String)
	maxOf(&err, "workspace_size", l.WorkspaceSize.ptr(), Size.Bytes, Size.String)
	maxOf(&err, "net_bytes", l.NetBytes.ptr(), Size.Bytes, Size.String)
	maxOf(&err, "cpus", l.CPUs, same, formatFloat)
	maxOf(&err, "pids", l.Pids, same, formatInt)
	maxOf(&err, "output_bytes", l.OutputBytes, same, formatInt)
	maxOf(&err, "net_connections", l.NetConns, same, formatInt)
	return err
}

// number is what a limit resolves to.
type number interface{ ~int64 | ~float64 }

// take sets *out to the limit name's value: v's, else def's; it must be
// above zero and at most max's. val and text read a T. It does nothing
// once *err is set, and sets *err to a *LimitError.
func take[T any, N number](err *error, out *N, name string, v, def, max *T, val func(T) N, text func(T) string) {
	if *err != nil {
		return
	}
	if v == nil {
		v = def
	}
	switch {
	case max == nil:
		*err = &LimitError{Field: "policy." + name, Reason: "required"}
	case v == nil:
		*err = &LimitError{Field: "limits." + name, Reason: "required"}
	case !(val(*v) > 0):
		*err = &LimitError{Field: "limits." + name, Reason: text(*v) + " must be greater than zero"}
	case val(*v) > val(*max):
		*err = &LimitError{Field: "limits." + name, Reason: text(*v) + " exceeds policy maximum " + text(*max), Policy: true}
	default:
		*out = val(*v)
	}
}

// maxOf checks a policy's maximum as take checks a value.
func maxOf[T any, N number](err *error, name string, max *T, val func(T) N, text func(T) string) {
	switch {
	case *err != nil:
	case max == nil:
		*err = &LimitError{Field: "policy." + name, Reason: "required"}
	case !(val(*max) > 0):
		*err = &LimitError{Field: "policy." + name, Reason: text(*max) + " must be greater than zero"}
	}
}

func same[N number](n N) N { return n }

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

func formatFloat(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }

// ptr is d, or nil when unset.
func (d Duration) ptr() *Duration {
	if !d.IsSet() {
		return nil
	}
	return &d
}

// ptr is s, or nil when unset.
func (s Size) ptr() *Size {
	if !s.IsSet() {
		return nil
	}
	return &s
}

// Limit describes one resource limit for the docs and the tests that
// check each limit reaches the sandbox: the values themselves are
// Limits' and Resolved's fields.
type Limit struct {
	// Name is the limit's key in a task's and the config's "limits", in
	// "policy", and Resolved's JSON name.
	Name string
	// Text is the limit's value in l as a config writes it ("" unset).
	Text func(l Limits) string
	// Min is the smallest value a sandbox can run with (0: any value
	// above zero).
	Min int64
	// Shape: the set-up of a sandbox uses the limit (it is in the spec or
	// sizes the workspace), so a pooled sandbox is made for one value of
	// it; a limit only the run uses (its timeout, its output cap, the
	// proxy's budgets) is not.
	Shape bool
	// Reaches says how the limit reaches the sandbox.
	Reaches string
}

// LimitTable is every resource limit, in the order of the docs' table.
var LimitTable = []Limit{
	{Name: "timeout", Text: func(l Limits) string { return l.Timeout.String() },
		Reaches: "the run's wall-clock timer, which kills the sandbox"},
	{Name: "memory", Text: func(l Limits) string { return l.Memory.String() }, Min: MinMemory, Shape: true,
		Reaches: "the memory cgroup (swap = memory), and the socket-buffer charge"},
	{Name: "tmp_size", Text: func(l Limits) string { return l.TmpSize.String() }, Min: MinTmpSize, Shape: true,
		Reaches: "the size of the /tmp tmpfs, and RLIMIT_FSIZE"},
	{Name: "workspace_size", Text: func(l Limits) string { return l.WorkspaceSize.String() }, Min: MinWorkspaceSize, Shape: true,
		Reaches: "the size of the /workspace tmpfs, and RLIMIT_FSIZE"},
	{Name: "net_bytes", Text: func(l Limits) string { return l.NetBytes.String() },
		Reaches: "the proxy's byte budget per direction"},
	{Name: "cpus", Text: func(l Limits) string { return optText(l.CPUs, formatFloat) }, Shape: true,
		Reaches: "the cpu cgroup's quota"},
	{Name: "pids", Text: func(l Limits) string { return optText(l.Pids, formatInt) }, Shape: true,
		Reaches: "the pids cgroup (plus one for the sandbox's init)"},
	{Name: "output_bytes", Text: func(l Limits) string { return optText(l.OutputBytes, formatInt) },
		Reaches: "the bytes kept of stdout and of stderr, each"},
	{Name: "net_connections", Text: func(l Limits) string { return optText(l.NetConns, formatInt) },
		Reaches: "the proxy's connections at once"},
}

func optText[T any](v *T, text func(T) string) string {
	if v == nil {
		return ""
	}
	return text(*v)
}

// defaultLimits are the built-in limits and policy maxima.
func defaultLimits() (limits, maxima Limits) {
	limits = Limits{Timeout: MustDuration("5s"), Memory: MustSize("256m"), TmpSize: MustSize("64m"),
		WorkspaceSize: MustSize("64m"), NetBytes: MustSize("64m"),
		CPUs: ptr(0.5), Pids: ptr[int64](64), OutputBytes: ptr[int64](65536), NetConns: ptr[int64](32)}
	maxima = Limits{Timeout: MustDuration("60s"), Memory: MustSize("2g"), TmpSize: MustSize("1g"),
		WorkspaceSize: MustSize("1g"), NetBytes: MustSize("1g"),
		CPUs: ptr(2.0), Pids: ptr[int64](512), OutputBytes: ptr[int64](1048576), NetConns: ptr[int64](256)}
	return limits, maxima
}
