package metrics

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/agentrun/agentrun/internal/result"
)

// Scrape parses what m writes with the Prometheus text parser.
func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	var b bytes.Buffer
	m.WritePrometheus(&b)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&b)
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, b.String())
	}
	return fams
}

// value is the value of the series of fam whose labels are all of want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, fam string, want map[string]string) float64 {
	t.Helper()
	f := fams[fam]
	if f == nil {
		t.Fatalf("no family %s", fam)
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.Counter.GetValue()
		case dto.MetricType_GAUGE:
			return m.Gauge.GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.Histogram.GetSampleCount())
		}
		t.Fatalf("%s: type %v", fam, f.GetType())
	}
	t.Fatalf("%s: no series %v", fam, want)
	return 0
}

// TestWritePrometheus: every series the spec names is there from the start
// with its type, the output parses, and each event moves its series.
func TestWritePrometheus(t *testing.T) {
	pool := PoolStats{Ready: map[string]int64{`dir:/x"y`: 2}, Hits: map[string]int64{`dir:/x"y`: 3}, Misses: map[string]int64{`dir:/x"y`: 1}}
	m := New(Gauges{Running: func() int64 { return 4 }, Queued: func() int64 { return 5 }, Pool: func() PoolStats { return pool },
		Held: func() int64 { return 6 }})
	fams := scrape(t, m)
	for name, typ := range map[string]dto.MetricType{
		"agentrun_runs_total": dto.MetricType_COUNTER, "agentrun_run_duration_seconds": dto.MetricType_HISTOGRAM,
		"agentrun_setup_seconds": dto.MetricType_HISTOGRAM, "agentrun_running": dto.MetricType_GAUGE,
		"agentrun_queued": dto.MetricType_GAUGE, "agentrun_pool_ready": dto.MetricType_GAUGE,
		"agentrun_pool_hits_total": dto.MetricType_COUNTER, "agentrun_pool_misses_total": dto.MetricType_COUNTER,
		"agentrun_egress_total": dto.MetricType_COUNTER, "agentrun_quota_refusals_total": dto.MetricType_COUNTER,
		"agentrun_approvals_held": dto.MetricType_GAUGE, "agentrun_approvals_decided_total": dto.MetricType_COUNTER,
		"agentrun_approvals_timed_out_total": dto.MetricType_COUNTER,
		"go_goroutines":                      dto.MetricType_GAUGE, "process_resident_memory_bytes": dto.MetricType_GAUGE,
	} {
		if f := fams[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want type %v", name, f, typ)
		}
	}
	if v := value(t, fams, "agentrun_runs_total", map[string]string{"outcome": "oom", "runtime": "runsc"}); v != 0 {
		t.Errorf("oom runs at start = %v", v)
	}
	img := map[string]string{"image": `dir:/x"y`}
	for fam, want := range map[string]float64{"agentrun_pool_ready": 2, "agentrun_pool_hits_total": 3, "agentrun_pool_misses_total": 1} {
		if v := value(t, fams, fam, img); v != want {
			t.Errorf("%s = %v, want %v", fam, v, want)
		}
	}
	if v := value(t, fams, "agentrun_running", nil); v != 4 {
		t.Errorf("running = %v", v)
	}

	m.Refused("libcontainer", QuotaPerMinute)
	m.Refused("libcontainer", "")
	m.Setup(true, 2*time.Millisecond)
	res := &result.Result{OOMKilled: true, ExitCode: 137}
	res.Network.Allowed = []result.Allowed{{Host: "a", Conns: 3}}
	res.Network.Denied = []result.Denied{{Host: "b", Count: 2}, {Host: "c", Count: 1}}
	m.Ran("runsc", false, time.Second, res)
	m.ApprovalDecided(ChannelPage, true)
	m.ApprovalDecided(ChannelAPI, false)
	m.ApprovalDecided(ChannelAPI, false)
	m.ApprovalTimedOut()
	fams = scrape(t, m)
	for _, c := range []struct {
		fam    string
		labels map[string]string
		want   float64
	}{
		{"agentrun_runs_total", map[string]string{"outcome": "refused", "runtime": "libcontainer"}, 2},
		{"agentrun_runs_total", map[string]string{"outcome": "oom", "runtime": "runsc"}, 1},
		{"agentrun_runs_total", map[string]string{"outcome": "ok", "runtime": "runsc"}, 0},
		{"agentrun_quota_refusals_total", map[string]string{"quota": "runs_per_minute"}, 1},
		{"agentrun_quota_refusals_total", map[string]string{"quota": "queue"}, 0},
		{"agentrun_setup_seconds", map[string]string{"path": "pool"}, 1},
		{"agentrun_setup_seconds", map[string]string{"path": "cold"}, 0},
		{"agentrun_run_duration_seconds", map[string]string{"path": "cold"}, 1},
		{"agentrun_egress_total", map[string]string{"decision": "allowed"}, 3},
		{"agentrun_egress_total", map[string]string{"decision": "denied"}, 3},
		{"agentrun_approvals_held", nil, 6},
		{"agentrun_approvals_decided_total", map[string]string{"channel": "page", "outcome": "approved"}, 1},
		{"agentrun_approvals_decided_total", map[string]string{"channel": "page", "outcome": "denied"}, 0},
		{"agentrun_approvals_decided_total", map[string]string{"channel": "api", "outcome": "denied"}, 2},
		{"agentrun_approvals_timed_out_total", nil, 1},
	} {
		if v := value(t, fams, c.fam, c.labels); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.fam, c.labels, v, c.want)
		}
	}
}

func TestOutcome(t *testing.T) {
	for want, res := range map[string]*result.Result{
		OK: {}, ExitNonzero: {ExitCode: 3}, Timeout: {TimedOut: true, ExitCode: 124},
		OOM: {OOMKilled: true, ExitCode: 137}, Error: {Error: "x", ExitCode: 125},
	} {
		if got := Outcome(res); got != want {
			t.Errorf("Outcome(%+v) = %s, want %s", res, got, want)
		}
	}
}

// TestToolCalled: each call moves its server, tool and outcome's series;
// past MaxToolSeries, a tool not yet seen counts as "other" while those
// seen go on counting as themselves.
func TestToolCalled(t *testing.T) {
	m := New(Gauges{})
	m.ToolCalled("github", "get_issue", "answered")
	m.ToolCalled("github", "get_issue", "answered")
	m.ToolCalled("github", "-", "refused")
	for i := 0; len(m.toolCalls.series) < MaxToolSeries; i++ {
		m.ToolCalled("flood", fmt.Sprintf("t%d", i), "refused")
	}
	m.ToolCalled("github", "new_tool", "answered")
	m.ToolCalled("github", "another", "answered")
	m.ToolCalled("github", "get_issue", "answered")
	fams := scrape(t, m)
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"server": "github", "tool": "get_issue", "outcome": "answered"}, 3},
		{map[string]string{"server": "github", "tool": "-", "outcome": "refused"}, 1},
		{map[string]string{"server": "github", "tool": "other", "outcome": "answered"}, 2},
	} {
		if v := value(t, fams, "agentrun_tool_calls_total", c.labels); v != c.want {
			t.Errorf("agentrun_tool_calls_total%v = %v, want %v", c.labels, v, c.want)
		}
	}
	for _, m := range fams["agentrun_tool_calls_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "tool" && (l.GetValue() == "new_tool" || l.GetValue() == "another") {
				t.Errorf("a tool past the series' bound has a series of its own: %v", m)
			}
		}
	}
	if n := len(fams["agentrun_tool_calls_total"].GetMetric()); n > MaxToolSeries+1 {
		t.Errorf("%d series; want at most %d and other", n, MaxToolSeries)
	}
}
