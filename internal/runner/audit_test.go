package runner

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAuditLimitsListEveryLimit: every limit of the plan (every field of
// task.Limits, under its JSON name) is in the audit record with the plan's
// value, so that a limit added to task.Limits and not to auditLimits fails
// here; the names records have always had stay.
func TestAuditLimitsListEveryLimit(t *testing.T) {
	p := testPlan()
	p.Allow, p.Services = allowOf("pypi.org"), []string{"db"}
	want := map[string]float64{}
	v := reflect.ValueOf(&p.Limits).Elem()
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		switch f := v.Field(i); {
		case f.Type() == reflect.TypeFor[time.Duration]():
			f.SetInt(int64(time.Duration(i+1) * time.Second))
			want[name+"_ms"] = float64((i + 1) * 1000)
		case f.CanFloat():
			f.SetFloat(float64(i) + 0.25)
			want[name] = float64(i) + 0.25
		default:
			f.SetInt(int64(i+1) << 20)
			want[name] = float64(int64(i+1) << 20)
		}
	}
	got := auditLimits(p)
	if !slices.Equal(got.NetworkAllow, []string{"pypi.org"}) || !slices.Equal(got.NetworkServices, []string{"db"}) {
		t.Errorf("audit network_allow %q, network_services %q; want [pypi.org] and [db]", got.NetworkAllow, got.NetworkServices)
	}
	if len(got.Values) != v.NumField() {
		t.Errorf("audit limits %v; want the %d of task.Limits", got.Values, v.NumField())
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
