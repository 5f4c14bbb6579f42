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
// A limit is a field here and one in Resolved, its row of LimitTable (its
// default, maximum and minimum, whether it shapes a pooled sandbox), and
// its place in the sandbox (runner.SandboxSpec, or the run or its proxy).
// Its resolution, its check in a policy, the built-in config, the pool's
// shape key, the audit record and the docs' table all follow the row.
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
	for _, lim := range LimitTable {
		if v := lim.Number(r); lim.Min > 0 && v < float64(lim.Min) {
			return Resolved{}, &LimitError{Field: "limits." + lim.Name, Reason: fmt.Sprintf("%d bytes is below the minimum %d", int64(v), lim.Min)}
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
	for _, lim := range LimitTable {
		if err := lim.resolve(l, def, max, &r); err != nil {
			return Resolved{}, err
		}
	}
	return r, nil
}

// checkMaxima checks that every limit of a policy is set and above zero.
func (l Limits) checkMaxima() error {
	for _, lim := range LimitTable {
		if err := lim.checkMax(l); err != nil {
			return err
		}
	}
	return nil
}

// Limit is one resource limit, defined once: every use of a limit walks
// LimitTable, so that a limit added to it is resolved, checked, defaulted,
// kept in the pool's shape key and the audit record, and documented.
type Limit struct {
	// Name is the limit's key in a task's and the config's "limits", in
	// "policy", and Resolved's JSON name.
	Name string
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
	// AuditKey is its key in the audit record's limits: Name, or for a
	// duration Name with "_ms" (the record holds milliseconds).
	AuditKey string

	// Text is the limit's value in l as a config writes it ("" unset).
	Text func(l Limits) string
	// Number is its value in r: bytes, cores, a count, or nanoseconds.
	Number func(r Resolved) float64
	// Audit is its value in r as the audit record holds it.
	Audit func(r Resolved) float64

	resolve  func(l, def, max Limits, r *Resolved) error
	checkMax func(max Limits) error
	defaults func(def, max *Limits)
}

// LimitTable is every resource limit, in the order of the docs' table
// and of the checks.
var LimitTable = []Limit{
	durationLimit("timeout", func(l *Limits) *Duration { return &l.Timeout }, func(r *Resolved) *time.Duration { return &r.Timeout },
		"5s", "60s", Limit{Reaches: "the run's wall-clock timer, which kills the sandbox"}),
	sizeLimit("memory", func(l *Limits) *Size { return &l.Memory }, func(r *Resolved) *int64 { return &r.Memory },
		"256m", "2g", Limit{Min: MinMemory, Shape: true, Reaches: "the memory cgroup (swap = memory), and the socket-buffer charge"}),
	sizeLimit("tmp_size", func(l *Limits) *Size { return &l.TmpSize }, func(r *Resolved) *int64 { return &r.TmpSize },
		"64m", "1g", Limit{Min: MinTmpSize, Shape: true, Reaches: "the size of the /tmp tmpfs, and RLIMIT_FSIZE"}),
	sizeLimit("workspace_size", func(l *Limits) *Size { return &l.WorkspaceSize }, func(r *Resolved) *int64 { return &r.WorkspaceSize },
		"64m", "1g", Limit{Min: MinWorkspaceSize, Shape: true, Reaches: "the size of the /workspace tmpfs, and RLIMIT_FSIZE"}),
	sizeLimit("net_bytes", func(l *Limits) *Size { return &l.NetBytes }, func(r *Resolved) *int64 { return &r.NetBytes },
		"64m", "1g", Limit{Reaches: "the proxy's byte budget per direction"}),
	numberLimit("cpus", func(l *Limits) **float64 { return &l.CPUs }, func(r *Resolved) *float64 { return &r.CPUs },
		0.5, 2, Limit{Shape: true, Reaches: "the cpu cgroup's quota"}),
	numberLimit("pids", func(l *Limits) **int64 { return &l.Pids }, func(r *Resolved) *int64 { return &r.Pids },
		64, 512, Limit{Shape: true, Reaches: "the pids cgroup (plus one for the sandbox's init)"}),
	numberLimit("output_bytes", func(l *Limits) **int64 { return &l.OutputBytes }, func(r *Resolved) *int64 { return &r.OutputBytes },
		65536, 1048576, Limit{Reaches: "the bytes kept of stdout and of stderr, each"}),
	numberLimit("net_connections", func(l *Limits) **int64 { return &l.NetConns }, func(r *Resolved) *int64 { return &r.NetConns },
		32, 256, Limit{Reaches: "the proxy's connections at once"}),
}

// number is what a limit resolves to.
type number interface{ ~int64 | ~float64 }

// field is how one limit is read and written: T is its JSON form
// (Duration, Size, float64, int64) and N its resolved number.
type field[T any, N number] struct {
	get  func(l Limits) *T // nil when unset
	set  func(l *Limits, v T)
	out  func(r *Resolved) *N
	num  func(v T) N
	text func(v T) string
}

// durationLimit is the row of a limit written as a Duration.
func durationLimit(name string, in func(*Limits) *Duration, out func(*Resolved) *time.Duration, def, max string, row Limit) Limit {
	row.AuditKey = name + "_ms"
	lim := newLimit(name, field[Duration, time.Duration]{
		get: func(l Limits) *Duration { return in(&l).ptr() },
		set: func(l *Limits, v Duration) { *in(l) = v },
		out: out, num: Duration.Duration, text: Duration.String,
	}, MustDuration(def), MustDuration(max), row)
	lim.Audit = func(r Resolved) float64 { return float64(out(&r).Milliseconds()) }
	return lim
}

// sizeLimit is the row of a limit written as a Size.
func sizeLimit(name string, in func(*Limits) *Size, out func(*Resolved) *int64, def, max string, row Limit) Limit {
	return newLimit(name, field[Size, int64]{
		get: func(l Limits) *Size { return in(&l).ptr() },
		set: func(l *Limits, v Size) { *in(l) = v },
		out: out, num: Size.Bytes, text: Size.String,
	}, MustSize(def), MustSize(max), row)
}

// numberLimit is the row of a limit written as a JSON number.
func numberLimit[N int64 | float64](name string, in func(*Limits) **N, out func(*Resolved) *N, def, max N, row Limit) Limit {
	return newLimit(name, field[N, N]{
		get:  func(l Limits) *N { return *in(&l) },
		set:  func(l *Limits, v N) { *in(l) = &v },
		out:  out,
		num:  func(v N) N { return v },
		text: formatNumber[N],
	}, def, max, row)
}

// newLimit fills row's functions from f, with def and max as the
// built-in default and maximum.
func newLimit[T any, N number](name string, f field[T, N], def, max T, row Limit) Limit {
	row.Name = name
	if row.AuditKey == "" {
		row.AuditKey = name
	}
	row.Text = func(l Limits) string {
		if v := f.get(l); v != nil {
			return f.text(*v)
		}
		return ""
	}
	row.Number = func(r Resolved) float64 { return float64(*f.out(&r)) }
	if row.Audit == nil {
		row.Audit = row.Number
	}
	row.resolve = func(l, dl, ml Limits, r *Resolved) error {
		v, m := f.get(l), f.get(ml)
		if v == nil {
			v = f.get(dl)
		}
		switch {
		case m == nil:
			return &LimitError{Field: "policy." + name, Reason: "required"}
		case v == nil:
			return &LimitError{Field: "limits." + name, Reason: "required"}
		case !(f.num(*v) > 0):
			return &LimitError{Field: "limits." + name, Reason: f.text(*v) + " must be greater than zero"}
		case f.num(*v) > f.num(*m):
			return &LimitError{Field: "limits." + name, Reason: f.text(*v) + " exceeds policy maximum " + f.text(*m), Policy: true}
		}
		*f.out(r) = f.num(*v)
		return nil
	}
	row.checkMax = func(ml Limits) error {
		switch m := f.get(ml); {
		case m == nil:
			return &LimitError{Field: "policy." + name, Reason: "required"}
		case !(f.num(*m) > 0):
			return &LimitError{Field: "policy." + name, Reason: f.text(*m) + " must be greater than zero"}
		}
		return nil
	}
	row.defaults = func(dl, ml *Limits) { f.set(dl, def); f.set(ml, max) }
	return row
}

func formatNumber[N int64 | float64](v N) string {
	if x, ok := any(v).(float64); ok {
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return strconv.FormatInt(int64(v), 10)
}

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

// defaultLimits are the built-in limits and policy maxima, from
// LimitTable.
func defaultLimits() (limits, maxima Limits) {
	for _, lim := range LimitTable {
		lim.defaults(&limits, &maxima)
	}
	return limits, maxima
}
