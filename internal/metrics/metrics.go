// Package metrics is the Prometheus side of `agentrun serve`: the series
// GET /metrics answers with, in the Prometheus text format.
//
//	agentrun_runs_total{outcome,runtime}        runs by how they ended
//	agentrun_run_duration_seconds{path}         admission to result
//	agentrun_setup_seconds{path}                the sandbox made ready (pool or cold)
//	agentrun_running, agentrun_queued           runs going on and waiting now
//	agentrun_pool_ready{image}                  sandboxes ready per pooled image
//	agentrun_pool_hits_total{image}             runs served from the pool
//	agentrun_pool_misses_total{image}           runs of a pooled image that ran cold
//	agentrun_egress_total{decision}             connections allowed, requests denied
//	agentrun_quota_refusals_total{quota}        runs_per_minute, concurrent, queue
//	go_*, process_*                             the Go runtime and the process
//
// It is built on github.com/VictoriaMetrics/metrics, whose package
// initialisation costs next to nothing: agentrun's binary re-executes itself
// as every container's init, and every package init runs again there
// (docs/bench.md has the measurement).
package metrics

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"github.com/agentrun/agentrun/internal/result"
)

// Outcomes of a run, the values of the outcome label.
const (
	OK          = "ok"
	ExitNonzero = "exit_nonzero"
	Timeout     = "timeout"
	OOM         = "oom"
	Refused     = "refused" // not started: bad task, above policy, over a quota, queue full
	Error       = "error"   // agentrun could not run it
)

// Paths a run's sandbox comes by, the values of the path label.
const (
	Pool = "pool"
	Cold = "cold"
)

// Quotas, the values of the quota label.
const (
	QuotaPerMinute  = "runs_per_minute"
	QuotaConcurrent = "concurrent"
	QuotaQueue      = "queue" // the server's queue was full
)

// Runtimes are the values of the runtime label that exist from the start.
var Runtimes = []string{"libcontainer", "runsc"}

// durationBuckets are the upper bounds of the duration histograms, in
// seconds: from a pooled set-up (milliseconds) to the longest policy
// timeouts.
var durationBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Gauges are read when scraped.
type Gauges struct {
	Running, Queued func() int64
	// Pool reports the warm pool; nil without one.
	Pool func() PoolStats
}

// PoolStats is the warm pool as the metrics see it, per image reference.
type PoolStats struct {
	Ready, Hits, Misses map[string]int64
}

// Metrics holds serve's series. It is safe for concurrent use.
type Metrics struct {
	set    *vm.Set
	gauges Gauges
}

// New returns the metrics of one server, reading g when scraped.
func New(g Gauges) *Metrics {
	// TYPE lines: histograms are then read as histograms. The switch is
	// the library's, global; serve is its only user.
	vm.ExposeMetadata(true)
	m := &Metrics{set: vm.NewSet(), gauges: g}
	if g.Running != nil {
		m.set.NewGauge("agentrun_running", func() float64 { return float64(g.Running()) })
	}
	if g.Queued != nil {
		m.set.NewGauge("agentrun_queued", func() float64 { return float64(g.Queued()) })
	}
	// Every fixed series exists from the start, at zero: a rate over a
	// series that appears with its first event misses that event.
	for _, rt := range Runtimes {
		for _, o := range []string{OK, ExitNonzero, Timeout, OOM, Refused, Error} {
			m.runs(o, rt)
		}
	}
	for _, p := range []string{Pool, Cold} {
		m.hist("agentrun_run_duration_seconds", "path", p)
		m.hist("agentrun_setup_seconds", "path", p)
	}
	for _, d := range []string{"allowed", "denied"} {
		m.counter("agentrun_egress_total", "decision", d)
	}
	for _, q := range []string{QuotaPerMinute, QuotaConcurrent, QuotaQueue} {
		m.counter("agentrun_quota_refusals_total", "quota", q)
	}
	return m
}

// Outcome is how res ended, as the outcome label says it.
func Outcome(res *result.Result) string {
	switch {
	case res.Error != "":
		return Error
	case res.TimedOut:
		return Timeout
	case res.OOMKilled:
		return OOM
	case res.ExitCode != 0:
		return ExitNonzero
	}
	return OK
}

// Refused counts a run of runtime refused before it started; quota, when
// not "", is the quota or queue that refused it.
func (m *Metrics) Refused(runtime, quota string) {
	m.runs(Refused, runtime).Inc()
	if quota != "" {
		m.counter("agentrun_quota_refusals_total", "quota", quota).Inc()
	}
}

// Setup records how long a run's sandbox took to be ready, and by which path.
func (m *Metrics) Setup(pooled bool, d time.Duration) {
	m.hist("agentrun_setup_seconds", "path", path(pooled)).Update(d.Seconds())
}

// Ran records a run that was admitted: its outcome, its time from
// admission to result, and its network decisions.
func (m *Metrics) Ran(runtime string, pooled bool, d time.Duration, res *result.Result) {
	m.runs(Outcome(res), runtime).Inc()
	m.hist("agentrun_run_duration_seconds", "path", path(pooled)).Update(d.Seconds())
	var allowed, denied int
	for _, a := range res.Network.Allowed {
		allowed += a.Conns
	}
	for _, d := range res.Network.Denied {
		denied += d.Count
	}
	m.counter("agentrun_egress_total", "decision", "allowed").Add(allowed)
	m.counter("agentrun_egress_total", "decision", "denied").Add(denied)
}

// WritePrometheus writes every series in the Prometheus text format.
func (m *Metrics) WritePrometheus(w io.Writer) {
	m.set.WritePrometheus(w)
	if m.gauges.Pool != nil {
		st := m.gauges.Pool()
		family(w, "agentrun_pool_ready", "gauge", st.Ready)
		family(w, "agentrun_pool_hits_total", "counter", st.Hits)
		family(w, "agentrun_pool_misses_total", "counter", st.Misses)
	}
	vm.WriteProcessMetrics(w)
}

func (m *Metrics) runs(outcome, runtime string) *vm.Counter {
	return m.set.GetOrCreateCounter(fmt.Sprintf("agentrun_runs_total{outcome=%s,runtime=%s}", quote(outcome), quote(runtime)))
}

func (m *Metrics) counter(name, label, value string) *vm.Counter {
	return m.set.GetOrCreateCounter(series(name, label, value))
}

func (m *Metrics) hist(name, label, value string) *vm.PrometheusHistogram {
	return m.set.GetOrCreatePrometheusHistogramExt(series(name, label, value), durationBuckets)
}

func path(pooled bool) string {
	if pooled {
		return Pool
	}
	return Cold
}

// series is name{label="value"}.
func series(name, label, value string) string {
	return name + "{" + label + "=" + quote(value) + "}"
}

// quote is a label value as the text format writes it: in double quotes,
// with backslash, double quote and newline escaped.
func quote(v string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v) + `"`
}

// family writes one series per image of a per-image family.
func family(w io.Writer, name, typ string, byImage map[string]int64) {
	images := make([]string, 0, len(byImage))
	for img := range byImage {
		images = append(images, img)
	}
	sort.Strings(images)
	fmt.Fprintf(w, "# HELP %s\n# TYPE %s %s\n", name, name, typ)
	for _, img := range images {
		fmt.Fprintf(w, "%s %d\n", series(name, "image", img), byImage[img])
	}
}
