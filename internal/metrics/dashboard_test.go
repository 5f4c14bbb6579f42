package metrics

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboard is the Grafana dashboard of serve's metrics.
var dashboard = filepath.Join("..", "..", "deploy", "grafana", "agentrun.json")

// TestDashboardQueriesExportedMetrics: every metric a query of the
// Grafana dashboard names is one a scrape of serve's /metrics has (a
// histogram's _bucket, _sum and _count series included), and every
// agentrun_ family the scrape has is on the dashboard.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	// Every gauge set, as serve sets them: every series it may export.
	m := New(Gauges{Running: func() int64 { return 0 }, Queued: func() int64 { return 0 }, Held: func() int64 { return 0 },
		Sandboxes: func() int64 { return 0 },
		Pool: func() PoolStats {
			return PoolStats{Ready: map[string]int64{"img": 1}, Hits: map[string]int64{"img": 0}, Misses: map[string]int64{"img": 0},
				Warm: map[string]string{"img": ""}}
		}})
	exported := map[string]string{} // series name -> family
	for name, fam := range scrape(t, m) {
		exported[name] = name
		if fam.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = name
			}
		}
	}
	exprs := queries(dash)
	if len(exprs) < 10 {
		t.Fatalf("%d queries in %s: %q", len(exprs), dashboard, exprs)
	}
	onDashboard := map[string]bool{}
	for _, e := range exprs {
		names := metricNames(e)
		if len(names) == 0 {
			t.Errorf("query %q names no metric", e)
		}
		for _, n := range names {
			fam, ok := exported[n]
			if !ok {
				t.Errorf("query %q: %s is not a metric agentrun exports", e, n)
			}
			onDashboard[fam] = true
		}
	}
	for name := range exported {
		if strings.HasPrefix(name, "agentrun_") && exported[name] == name && !onDashboard[name] {
			t.Errorf("%s is exported but on no panel of %s", name, dashboard)
		}
	}
}

// queries are the PromQL expressions of the dashboard: the targets' expr
// and the template variables' queries, at any depth.
func queries(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			switch s, ok := x.(string); {
			case ok && (k == "expr" || k == "definition"):
				out = append(out, s)
			case ok && k == "query" && strings.Contains(s, "("):
				out = append(out, s)
			default:
				out = append(out, queries(x)...)
			}
		}
	case []any:
		for _, x := range v {
			out = append(out, queries(x)...)
		}
	}
	return out
}

var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}|\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promNumbers  = regexp.MustCompile(`\b[0-9][0-9.]*[a-zA-Z]*`) // 0.95, 5m, 1e3
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
)

// metricNames are the metric names PromQL expression e selects: its
// identifiers, less function calls, keywords, label names and strings.
// Grafana's label_values(METRIC, LABEL) names METRIC.
func metricNames(e string) []string {
	e = promStrings.ReplaceAllString(e, `""`)
	e = promMatchers.ReplaceAllString(e, "")
	e = promGrouping.ReplaceAllString(e, "")
	e = promNumbers.ReplaceAllString(e, "0")
	if rest, ok := strings.CutPrefix(strings.TrimSpace(e), "label_values("); ok {
		e, _, _ = strings.Cut(rest, ",")
	}
	var names []string
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		name := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[0]), "("))
		if m[1] != "" || slices.Contains(promKeywords, strings.ToLower(name)) || strings.HasPrefix(name, "$") {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// TestMetricNames: the names metricNames finds in PromQL.
func TestMetricNames(t *testing.T) {
	for e, want := range map[string]string{
		`sum by (outcome) (rate(agentrun_runs_total{instance=~"$instance", outcome!="refused"}[$__rate_interval]))`: "agentrun_runs_total",
		`histogram_quantile(0.95, sum by (le, path) (rate(agentrun_setup_seconds_bucket{a="b"}[5m])))`:              "agentrun_setup_seconds_bucket",
		`sum(rate(a_total[1m])) / (sum(rate(a_total[1m])) + sum(b_total offset 5m))`:                                "a_total b_total",
		`label_values(agentrun_running, instance)`:                                                                  "agentrun_running",
		`x{l="sum(y)"} and on (instance) z`:                                                                         "x z",
	} {
		if got := strings.Join(metricNames(e), " "); got != want {
			t.Errorf("metricNames(%q) = %q; want %q", e, got, want)
		}
	}
}
