package task

import (
	"testing"

	"github.com/agentrun/agentrun/internal/config"
)

// Each limit of config.LimitTable resolves, from the built-in config, to
// its table default in its field of Limits.
func TestLimitTableResolvesToDefaults(t *testing.T) {
	l, err := resolveLimits(config.Limits{}, config.Default())
	if err != nil {
		t.Fatal(err)
	}
	for _, lim := range config.LimitTable {
		got := lim.Of(&l)
		var want string
		switch lim.Unit {
		case config.Cores:
			want = format(got.Float())
		default:
			want = format(got.Int())
		}
		var def int64
		switch lim.Unit {
		case config.Duration, config.Bytes:
			if def, err = lim.Parse(lim.Default); err != nil {
				t.Fatalf("%s: default %q: %v", lim.Name, lim.Default, err)
			}
			if want != format(def) {
				t.Errorf("%s resolved to %s; want the table's %s (%d)", lim.Name, want, lim.Default, def)
			}
		default:
			if want != lim.Default {
				t.Errorf("%s resolved to %s; want the table's %s", lim.Name, want, lim.Default)
			}
		}
	}
}
