package runner

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
)

// TestAuditLimitsFollowTheTable: every limit of config.LimitTable is in the
// audit record with the plan's value, so a new limit appears there without
// an edit here; the names records have always had stay.
func TestAuditLimitsFollowTheTable(t *testing.T) {
	p := testPlan()
	p.Allow, p.Services = []string{"pypi.org"}, []string{"db"}
	want := map[string]float64{}
	for i, lim := range config.LimitTable {
		f := lim.Of(&p.Limits)
		switch {
		case lim.Unit == config.Duration:
			f.SetInt(int64(time.Duration(i+1) * time.Second))
			want[lim.Name+"_ms"] = float64((i + 1) * 1000)
		case f.CanFloat():
			f.SetFloat(float64(i) + 0.25)
			want[lim.Name] = float64(i) + 0.25
		default:
			f.SetInt(int64(i+1) << 20)
			want[lim.Name] = float64(int64(i+1) << 20)
		}
	}
	got := auditLimits(p)
	if len(got.Values) != len(config.LimitTable) {
		t.Errorf("audit limits %v; want the %d of LimitTable", got.Values, len(config.LimitTable))
	}
	for name, v := range want {
		if g, ok := got.Values[name]; !ok || g != v {
			t.Errorf("audit limit %s = %v (present %v); want %v", name, g, ok, v)
		}
	}

	line, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(line, &fields); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"timeout_ms", "memory", "cpus", "pids", "output_bytes", "tmp_size", "workspace_size",
		"network_allow", "network_services"} {
		if _, ok := fields[name]; !ok {
			t.Errorf("audit limits %s lack %q", line, name)
		}
	}
}
