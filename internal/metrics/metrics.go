// Package metrics is the Prometheus side of `agentrun serve`: the series
// GET /metrics answers with, in the Prometheus text format (0.0.4).
//
//	agentrun_runs_total{outcome,runtime}        runs by how they ended
//	agentrun_run_duration_seconds{path}         admission to result, pool or cold
//	agentrun_setup_seconds{path}                the sandbox made ready, pool or cold
//	agentrun_running, agentrun_queued           runs going on and waiting now
//	agentrun_bodies_reading, agentrun_body_bytes  task bodies being read; the body budget in use
//	agentrun_pool_ready{image}                  sandboxes ready per pooled image
//	agentrun_pool_hits_total{image}             runs served from the pool
//	agentrun_pool_misses_total{image}           runs of a pooled image that ran cold
//	agentrun_egress_total{decision}             connections allowed, requests denied
//	agentrun_quota_refusals_total{quota}        runs_per_minute, concurrent, queue, body_memory
//	agentrun_approvals_held                     requests held for a decision on the server now
//	agentrun_approvals_decided_total{channel,outcome}  decisions: api or page; approved or denied
//	agentrun_approvals_timed_out_total          held requests denied at approval_timeout
//	agentrun_token_guesses_refused_total        requests refused uncompared: their source guessed server.token wrong too often
//	go_*, process_*                             the Go runtime and the process
//
// It is written here on the standard library, with no package-level
// initialisation at all: agentrun's binary re-executes itself as every
// container's init, where every package's init runs again, and the
// Prometheus libraries measured 0.5 to 1.3 ms of init there (docs/bench.md).
// The output is checked with the Prometheus text parser in the tests.
package metrics

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// Signaled: a live sandbox's process killed by a signal.
	Signaled = "signaled"
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
	QuotaQueue      = "queue"       // the server's queue was full
	QuotaBodies     = "body_memory" // the server's budget of task bodies was full
)

// Gauges are read when scraped.
type Gauges struct {
	Running, Queued func() int64
	// Reading is the number of task bodies being read; BodyBytes the
	// bytes of the server's body budget in use (bodies being read and
	// read ones waiting for a run slot).
	Reading, BodyBytes func() int64
	// Held is the number of requests held for approval on the server.
	Held func() int64
	// Pool reports the warm pool; nil without one.
	Pool func() PoolStats
	// Sandboxes is the number of live sandboxes.
	Sandboxes func() int64
}

// PoolStats is the warm pool as the metrics see it, per image reference.
type PoolStats struct {
	Ready, Hits, Misses map[string]int64
	// Warm is, per image with warm settings, "" while it gets warm
	// sandboxes, or why it gets plain ones instead.
	Warm map[string]string
}

// Metrics holds serve's series. It is safe for concurrent use.
type Metrics struct {
	gauges  Gauges
	started time.Time

	runs, egress, quotas *counters
	runTime, setupTime   *histograms
	decided              *counters
	toolCalls            *counters
	sandboxProcs         *counters
	timedOut             atomic.Uint64
	guessesRefused       atomic.Uint64
}

// Channels an approval is decided by, the values of the channel label.
const (
	ChannelAPI  = "api"  // POST /v1/runs/RUN/approvals/ID (a stream's client, a webhook's receiver)
	ChannelPage = "page" // the approvals page
)

// New returns the metrics of one server, reading g when scraped.
func New(g Gauges) *Metrics {
	m := &Metrics{gauges: g, started: time.Now(),
		runs:         newCounters("agentrun_runs_total", "Runs by how they ended (refused: never started)."),
		egress:       newCounters("agentrun_egress_total", "Egress decisions of the runs' proxies: connections allowed, requests denied."),
		quotas:       newCounters("agentrun_quota_refusals_total", "Runs refused by a session quota or a full queue."),
		runTime:      newHistograms("agentrun_run_duration_seconds", "Time from a run's admission to its result."),
		setupTime:    newHistograms("agentrun_setup_seconds", "Time to a run's sandbox being ready: from the pool, or set up cold."),
		decided:      newCounters("agentrun_approvals_decided_total", "Requests held for approval that an operator decided, by channel and outcome."),
		toolCalls:    newCounters("agentrun_tool_calls_total", "Calls of the runs' programs to tool servers, by server, tool and outcome (answered, refused, failed)."),
		sandboxProcs: newCounters("agentrun_sandbox_processes_total", "Processes of live sandboxes by how they ended (refused: never started)."),
	}
	for _, o := range []string{OK, ExitNonzero, Timeout, Signaled, Refused, Error} {
		m.sandboxProcs.add(labels("outcome", o), 0)
	}
	for _, c := range []string{ChannelAPI, ChannelPage} {
		for _, o := range []string{"approved", "denied"} {
			m.decided.add(labels("channel", c, "outcome", o), 0)
		}
	}
	// Every fixed series exists from the start, at zero: a rate over a
	// series that appears with its first event misses that event.
	for _, rt := range []string{"libcontainer", "runsc"} {
		for _, o := range []string{OK, ExitNonzero, Timeout, OOM, Refused, Error} {
			m.runs.add(labels("outcome", o, "runtime", rt), 0)
		}
	}
	for _, d := range []string{"allowed", "denied"} {
		m.egress.add(labels("decision", d), 0)
	}
	for _, q := range []string{QuotaPerMinute, QuotaConcurrent, QuotaQueue, QuotaBodies} {
		m.quotas.add(labels("quota", q), 0)
	}
	for _, p := range []string{Pool, Cold} {
		m.runTime.get(labels("path", p))
		m.setupTime.get(labels("path", p))
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
	m.runs.add(labels("outcome", Refused, "runtime", runtime), 1)
	if quota != "" {
		m.quotas.add(labels("quota", quota), 1)
	}
}

// Setup records how long a run's sandbox took to be ready, and by which path.
func (m *Metrics) Setup(pooled bool, d time.Duration) {
	m.setupTime.get(labels("path", path(pooled))).observe(d.Seconds())
}

// Ran records a run that was admitted: its outcome, its time from
// admission to result, and its network decisions.
func (m *Metrics) Ran(runtime string, pooled bool, d time.Duration, res *result.Result) {
	m.runs.add(labels("outcome", Outcome(res), "runtime", runtime), 1)
	m.runTime.get(labels("path", path(pooled))).observe(d.Seconds())
	var allowed, denied int
	for _, a := range res.Network.Allowed {
		allowed += a.Conns
	}
	for _, d := range res.Network.Denied {
		denied += d.Count
	}
	m.egress.add(labels("decision", "allowed"), uint64(allowed))
	m.egress.add(labels("decision", "denied"), uint64(denied))
}

// ApprovalDecided counts a held request decided through channel.
func (m *Metrics) ApprovalDecided(channel string, approved bool) {
	outcome := "denied"
	if approved {
		outcome = "approved"
	}
	m.decided.add(labels("channel", channel, "outcome", outcome), 1)
}

// MaxToolSeries bounds the series of agentrun_tool_calls_total: a
// program names the tools it calls, so past this many the tool label of
// a new series is "other".
const MaxToolSeries = 1000

// ToolCalled counts a run's call to a tool server: server is "-" for a
// name the run does not have, tool "-" for a call no rule allowed (both
// the program's words), outcome the broker's.
func (m *Metrics) ToolCalled(server, tool, outcome string) {
	l := labels("outcome", outcome, "server", server, "tool", tool)
	m.toolCalls.mu.Lock()
	_, seen := m.toolCalls.series[l]
	full := len(m.toolCalls.series) >= MaxToolSeries
	m.toolCalls.mu.Unlock()
	if !seen && full {
		l = labels("outcome", outcome, "server", server, "tool", "other")
	}
	m.toolCalls.add(l, 1)
}

// SandboxProcess counts a process of a live sandbox that ended, or was
// refused, by outcome (OK, ExitNonzero, Timeout, Signaled, Refused,
// Error).
func (m *Metrics) SandboxProcess(outcome string) {
	m.sandboxProcs.add(labels("outcome", outcome), 1)
}

// ApprovalTimedOut counts a held request that no one decided in time.
func (m *Metrics) ApprovalTimedOut() { m.timedOut.Add(1) }

// GuessRefused counts a request carrying a token refused without
// comparing it, its source having guessed the token wrong too often.
func (m *Metrics) GuessRefused() { m.guessesRefused.Add(1) }

// WritePrometheus writes every series in the Prometheus text format.
func (m *Metrics) WritePrometheus(w io.Writer) {
	var b strings.Builder
	m.runs.write(&b)
	m.runTime.write(&b)
	m.setupTime.write(&b)
	if m.gauges.Running != nil {
		single(&b, "agentrun_running", "gauge", "Runs going on.", float64(m.gauges.Running()))
	}
	if m.gauges.Queued != nil {
		single(&b, "agentrun_queued", "gauge", "Runs waiting for a slot.", float64(m.gauges.Queued()))
	}
	if m.gauges.Reading != nil {
		single(&b, "agentrun_bodies_reading", "gauge", "Task bodies being read.", float64(m.gauges.Reading()))
	}
	if m.gauges.BodyBytes != nil {
		single(&b, "agentrun_body_bytes", "gauge", "Bytes of the task body budget in use: bodies being read, and read ones waiting for a run slot.", float64(m.gauges.BodyBytes()))
	}
	if m.gauges.Pool != nil {
		st := m.gauges.Pool()
		perImage(&b, "agentrun_pool_ready", "gauge", "Sandboxes ready in the warm pool.", st.Ready)
		perImage(&b, "agentrun_pool_hits_total", "counter", "Runs served from the warm pool.", st.Hits)
		perImage(&b, "agentrun_pool_misses_total", "counter", "Runs of a pooled image that ran cold.", st.Misses)
		if len(st.Warm) > 0 {
			header(&b, "agentrun_pool_warm", "gauge", "1 while a warm pool's image gets warm sandboxes; 0, with the reason, once they failed and it gets plain ones.")
			for _, img := range sortedKeys(st.Warm) {
				v := 1
				if st.Warm[img] != "" {
					v = 0
				}
				fmt.Fprintf(&b, "agentrun_pool_warm{%s} %d\n", labels("image", img, "reason", st.Warm[img]), v)
			}
		}
	}
	m.egress.write(&b)
	m.quotas.write(&b)
	if m.gauges.Held != nil {
		single(&b, "agentrun_approvals_held", "gauge", "Requests held for approval on the server now.", float64(m.gauges.Held()))
	}
	m.decided.write(&b)
	m.toolCalls.write(&b)
	if m.gauges.Sandboxes != nil {
		single(&b, "agentrun_sandboxes_live", "gauge", "Live sandboxes now.", float64(m.gauges.Sandboxes()))
	}
	m.sandboxProcs.write(&b)
	single(&b, "agentrun_approvals_timed_out_total", "counter", "Held requests denied at the approval timeout, no one having decided.", float64(m.timedOut.Load()))
	single(&b, "agentrun_token_guesses_refused_total", "counter", "Requests carrying server.token refused without comparing it, their source having got it wrong too often.", float64(m.guessesRefused.Load()))
	writeRuntime(&b, m.started)
	io.WriteString(w, b.String())
}

func path(pooled bool) string {
	if pooled {
		return Pool
	}
	return Cold
}

// labels is the label set of kv (name, value, ...) as the text format
// writes it between braces.
func labels(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[i])
		b.WriteString(`="`)
		b.WriteString(escape(kv[i+1]))
		b.WriteByte('"')
	}
	return b.String()
}

// escape is a label value as the text format writes it: backslash, double
// quote and newline escaped.
func escape(v string) string {
	if !strings.ContainsAny(v, "\\\"\n") {
		return v
	}
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

func header(b *strings.Builder, name, typ, help string) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func single(b *strings.Builder, name, typ, help string, v float64) {
	header(b, name, typ, help)
	fmt.Fprintf(b, "%s %g\n", name, v)
}

func perImage(b *strings.Builder, name, typ, help string, byImage map[string]int64) {
	header(b, name, typ, help)
	for _, img := range sortedKeys(byImage) {
		fmt.Fprintf(b, "%s{%s} %d\n", name, labels("image", img), byImage[img])
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// counters is one counter family, a series per label set.
type counters struct {
	name, help string
	mu         sync.Mutex
	series     map[string]*atomic.Uint64
}

func newCounters(name, help string) *counters {
	return &counters{name: name, help: help, series: map[string]*atomic.Uint64{}}
}

func (c *counters) add(labels string, n uint64) {
	c.mu.Lock()
	v := c.series[labels]
	if v == nil {
		v = new(atomic.Uint64)
		c.series[labels] = v
	}
	c.mu.Unlock()
	v.Add(n)
}

func (c *counters) write(b *strings.Builder) {
	header(b, c.name, "counter", c.help)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range sortedKeys(c.series) {
		fmt.Fprintf(b, "%s{%s} %d\n", c.name, l, c.series[l].Load())
	}
}

// buckets are the upper bounds of the duration histograms, in seconds:
// from a pooled set-up (milliseconds) to the longest policy timeouts.
func buckets() []float64 {
	return []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
}

// histograms is one histogram family, a histogram per label set.
type histograms struct {
	name, help string
	mu         sync.Mutex
	series     map[string]*histogram
}

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	count  uint64
}

func newHistograms(name, help string) *histograms {
	return &histograms{name: name, help: help, series: map[string]*histogram{}}
}

// hist is a handle on one histogram of a family.
type hist struct {
	f *histograms
	h *histogram
}

func (f *histograms) get(labels string) hist {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.series[labels]
	if h == nil {
		bounds := buckets()
		h = &histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
		f.series[labels] = h
	}
	return hist{f, h}
}

func (h hist) observe(v float64) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	i := sort.SearchFloat64s(h.h.bounds, v) // the first bound >= v
	h.h.counts[i]++
	h.h.sum += v
	h.h.count++
}

func (f *histograms) write(b *strings.Builder) {
	header(b, f.name, "histogram", f.help)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range sortedKeys(f.series) {
		h := f.series[l]
		var cum uint64
		for i, le := range h.bounds {
			cum += h.counts[i]
			fmt.Fprintf(b, "%s_bucket{%s,le=\"%g\"} %d\n", f.name, l, le, cum)
		}
		fmt.Fprintf(b, "%s_bucket{%s,le=\"+Inf\"} %d\n", f.name, l, h.count)
		fmt.Fprintf(b, "%s_sum{%s} %g\n%s_count{%s} %d\n", f.name, l, h.sum, f.name, l, h.count)
	}
}
