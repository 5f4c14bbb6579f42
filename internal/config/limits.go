package config

import (
	"fmt"
	"reflect"
	"strconv"
)

// Unit is how a limit is written in JSON and what its resolved value counts.
type Unit int

const (
	Duration Unit = iota // a Go duration string ("5s"); resolved in nanoseconds
	Bytes                // a size string ("256m", binary units); resolved in bytes
	Count                // a JSON integer
	Cores                // a JSON number of CPU cores, fractional
)

// Limit defines one resource limit, once: the config's defaults and policy,
// their validation, a task's resolved limits (package task) and the shape
// of a pooled sandbox (package runner) are derived from LimitTable.
type Limit struct {
	// Name is the limit's key in a task's and the config's "limits" and in
	// "policy".
	Name string
	// Field is its Go field in Limits, Policy and task.Limits.
	Field string
	Unit  Unit
	// Default and Max are the built-in default and policy maximum, as
	// written in a config.
	Default, Max string
	// Min is the smallest value a sandbox can run with (0: any value above
	// zero).
	Min int64
	// Shape: the set-up of a sandbox uses the limit (it is in the spec or
	// sizes the workspace), so a pooled sandbox is made for one value of
	// it; a limit only the run uses (its timeout, its output cap, the
	// proxy's budgets) is not.
	Shape bool
	// Reaches says how the limit reaches the sandbox.
	Reaches string
}

// LimitTable is every resource limit, in the order they are checked.
var LimitTable = []Limit{
	{Name: "timeout", Field: "Timeout", Unit: Duration, Default: "5s", Max: "60s",
		Reaches: "the run's wall-clock timer, which kills the sandbox"},
	{Name: "memory", Field: "Memory", Unit: Bytes, Default: "256m", Max: "2g", Min: 8 << 20, Shape: true, // the init and a small program
		Reaches: "the memory cgroup (swap = memory), and the socket-buffer charge"},
	{Name: "tmp_size", Field: "TmpSize", Unit: Bytes, Default: "64m", Max: "1g", Min: 64 << 10, Shape: true,
		Reaches: "the size of the /tmp tmpfs, and RLIMIT_FSIZE"},
	{Name: "workspace_size", Field: "WorkspaceSize", Unit: Bytes, Default: "64m", Max: "1g", Min: 64 << 10, Shape: true,
		Reaches: "the size of the /workspace tmpfs, and RLIMIT_FSIZE"},
	{Name: "net_bytes", Field: "NetBytes", Unit: Bytes, Default: "64m", Max: "1g",
		Reaches: "the proxy's byte budget per direction"},
	{Name: "cpus", Field: "CPUs", Unit: Cores, Default: "0.5", Max: "2", Shape: true,
		Reaches: "the cpu cgroup's quota"},
	{Name: "pids", Field: "Pids", Unit: Count, Default: "64", Max: "512", Shape: true,
		Reaches: "the pids cgroup (plus one for the sandbox's init)"},
	{Name: "output_bytes", Field: "OutputBytes", Unit: Count, Default: "65536", Max: "1048576",
		Reaches: "the bytes kept of stdout and of stderr, each"},
	{Name: "net_connections", Field: "NetConns", Unit: Count, Default: "32", Max: "256",
		Reaches: "the proxy's connections at once"},
}

// Text reports whether the limit is written as a string (a duration or a
// size); Count and Cores are JSON numbers.
func (l Limit) Text() bool { return l.Unit == Duration || l.Unit == Bytes }

// Parse parses a duration or size as written in JSON.
func (l Limit) Parse(s string) (int64, error) {
	if l.Unit == Duration {
		d, err := ParseDuration(s)
		return int64(d), err
	}
	return ParseSize(s)
}

// Of is the limit's field in v, a *Limits, *Policy or a struct of resolved
// limits with the same field names (task.Limits).
func (l Limit) Of(v any) reflect.Value {
	f := reflect.ValueOf(v).Elem().FieldByName(l.Field)
	if !f.IsValid() {
		panic(fmt.Sprintf("config: %T has no field %s for limit %s", v, l.Field, l.Name))
	}
	return f
}

// set stores s, written as in a config, in the limit's field of v (a
// *Limits or *Policy).
func (l Limit) set(v any, s string) {
	f := l.Of(v)
	switch l.Unit {
	case Count:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			panic(err)
		}
		f.Set(reflect.ValueOf(&n))
	case Cores:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			panic(err)
		}
		f.Set(reflect.ValueOf(&x))
	default:
		f.SetString(s)
	}
}

// defaultLimits are the built-in limits and policy maxima of LimitTable.
func defaultLimits() (Limits, Policy) {
	var l Limits
	var p Policy
	for _, lim := range LimitTable {
		lim.set(&l, lim.Default)
		lim.set(&p, lim.Max)
	}
	return l, p
}
