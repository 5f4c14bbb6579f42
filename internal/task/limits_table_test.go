package task

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
)

// jsonName is a struct field's JSON name.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// Every limit is a field of config.Limits and of Limits under the same
// name, a row of config.LimitTable, and resolves from the task's own
// field to Limits' own: a task asking for the policy's maximum of one
// limit gets it there, and every other limit keeps its default. A limit
// added to one struct and not to the rest, or whose row of
// config.LimitTable reads or writes another's field, fails here.
func TestEveryLimitResolvesToItsField(t *testing.T) {
	cfg := config.Default()
	def, err := resolveLimits(config.Limits{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Every limit at its maximum.
	all, err := resolveLimits(cfg.Policy.Limits, cfg)
	if err != nil {
		t.Fatal(err)
	}
	in, out := reflect.TypeFor[config.Limits](), reflect.TypeFor[Limits]()
	if in.NumField() != out.NumField() || in.NumField() != len(config.LimitTable) {
		t.Fatalf("config.Limits has %d fields, Limits %d, config.LimitTable %d rows; want one each per limit", in.NumField(), out.NumField(), len(config.LimitTable))
	}
	for i, lim := range config.LimitTable {
		if got := jsonName(out.Field(i)); got != lim.Name {
			t.Errorf("Limits field %d is %q; LimitTable's row %d is %q", i, got, i, lim.Name)
		}
	}
	for f := range in.Fields() {
		name := jsonName(f)
		t.Run(name, func(t *testing.T) {
			var lim *config.Limit
			for i := range config.LimitTable {
				if config.LimitTable[i].Name == name {
					lim = &config.LimitTable[i]
				}
			}
			if lim == nil {
				t.Fatalf("config.Limits' %s is not in config.LimitTable", name)
			}
			if lim.Text(cfg.Limits) == "" || lim.Text(cfg.Policy.Limits) == "" {
				t.Fatalf("%s has no built-in default or maximum", name)
			}
			max := lim.Text(cfg.Policy.Limits)
			value, _ := json.Marshal(max)
			if k := f.Type.Kind(); k == reflect.Pointer {
				value = []byte(max) // a JSON number
			}
			// memory at its maximum too, so that a larger /tmp fits.
			task := `{"code":"x","limits":{"memory":"` + cfg.Policy.Memory.String() + `","` + name + `":` + string(value) + `}}`
			if name == "memory" {
				task = `{"code":"x","limits":{"memory":` + string(value) + `}}`
			}
			p, err := Load([]byte(task), cfg)
			if err != nil {
				t.Fatalf("%s: %v", task, err)
			}
			got, atDef, atMax := reflect.ValueOf(p.Limits), reflect.ValueOf(def), reflect.ValueOf(all)
			for j := range out.NumField() {
				o := jsonName(out.Field(j))
				g, w := got.Field(j).Interface(), atDef.Field(j).Interface()
				if o == name || o == "memory" {
					w = atMax.Field(j).Interface()
				}
				if g != w {
					t.Errorf("asking for %s at its maximum: %s = %v; want %v", name, o, g, w)
				}
			}
		})
	}
}

// TestTypedLimits: a task's durations and sizes are read at Parse,
// naming the key; "" or null is the config's default.
func TestTypedLimits(t *testing.T) {
	for in, want := range map[string]string{
		`{"code":"x","limits":{"memory":"lots"}}`:   `task: limits.memory: invalid size "lots": want a number with an optional unit k, m, g or t`,
		`{"code":"x","limits":{"timeout":"0s"}}`:    `task: limits.timeout: invalid duration "0s": must be greater than zero`,
		`{"code":"x","limits":{"tmp_size":1024}}`:   `task: limits.tmp_size: expected a string, got a number`,
		`{"code":"x","limits":{"memory":"0"}}`:      `task: limits.memory: 0 must be greater than zero`,
		`{"code":"x","limits":{"memory":"4m"}}`:     `task: limits.memory: 4194304 bytes is below the minimum 8388608`,
		`{"code":"x","limits":{"timeout":"2m"}}`:    `task: limits.timeout: 2m exceeds policy maximum 60s`,
		`{"code":"x","limits":{"tmp_size":"1g"}}`:   `task: limits.tmp_size: 1073741824 bytes is above limits.memory (268435456 bytes)`,
		`{"code":"x","limits":{"pids":0}}`:          `task: limits.pids: 0 must be greater than zero`,
		`{"code":"x","limits":{"cpus":2.5}}`:        `task: limits.cpus: 2.5 exceeds policy maximum 2`,
		`{"code":"x","limits":{"net_bytes":"1.5"}}`: `task: limits.net_bytes: invalid size "1.5": not a whole number of bytes`,
	} {
		_, err := Load([]byte(in), config.Default())
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%s: %v; want %q", in, err, want)
		}
	}
	p, err := Load([]byte(`{"code":"x","limits":{"timeout":"","memory":null}}`), config.Default())
	if err != nil || p.Limits.Timeout != 5*time.Second || p.Limits.Memory != 256<<20 {
		t.Errorf(`"" and null: %v, %+v; want the defaults`, err, p)
	}
}
