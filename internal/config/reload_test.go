package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/endpoint"
)

// TestReloadTableClassifiesEveryKey: every key of the config, found by
// walking the Config struct (a key added later too), is under a row of
// ReloadTable, so that it is either applied by a reload or refused by
// one; every row names a key or a section of the config, once, and is
// the row of some key.
func TestReloadTableClassifiesEveryKey(t *testing.T) {
	keys := ConfigKeys()
	if len(keys) < 50 || !slices.Contains(keys, "tool_limits.calls") || !slices.Contains(keys, "server.quota.concurrent") ||
		!slices.Contains(keys, "policy.memory") || !slices.Contains(keys, "network.hosts") || !slices.Contains(keys, "tools") {
		t.Fatalf("ConfigKeys() = %v: the walk misses keys", keys)
	}
	used := map[string]bool{}
	for _, k := range keys {
		row, ok := ReloadOf(k)
		if !ok {
			t.Errorf("config key %q is in no row of config.ReloadTable: say whether a reload applies it (everywhere serve reads it) or only a restart does", k)
			continue
		}
		used[row.Key] = true
	}
	seen := map[string]bool{}
	for _, row := range ReloadTable {
		if seen[row.Key] {
			t.Errorf("ReloadTable names %q twice", row.Key)
		}
		seen[row.Key] = true
		if !used[row.Key] {
			t.Errorf("ReloadTable's row %q is the row of no key of the config", row.Key)
		}
		if row.Effect == "" {
			t.Errorf("ReloadTable's row %q says nothing of its effect", row.Key)
		}
	}
}

// changed sets the value of a key (v, settable) to another one.
func changed(t *testing.T, key string, v reflect.Value) {
	t.Helper()
	switch x := v.Addr().Interface().(type) {
	case *Duration:
		*x = MustDuration("1234s")
		return
	case *Size:
		*x = MustSize("1234m")
		return
	case *Addr:
		*x = MustAddr("tcp://127.0.0.1:1")
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "-other")
	case reflect.Int, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Slice:
		v.Set(reflect.Append(v, reflect.New(v.Type().Elem()).Elem()))
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("other-key").Convert(v.Type().Key()), reflect.New(v.Type().Elem()).Elem())
		v.Set(m)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
	default:
		t.Fatalf("%s: no way to change a %s", key, v.Type())
	}
}

// TestRestartOnlyNamesEachKey: a change of each restart-only key, alone,
// is named by RestartOnly; a change of any other key is not.
func TestRestartOnlyNamesEachKey(t *testing.T) {
	for _, k := range ConfigKeys() {
		next := Default()
		changed(t, k, configValues(next)[k])
		row, _ := ReloadOf(k)
		got := RestartOnly(Default(), next)
		want := []string(nil)
		if row.Restart {
			want = []string{k}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s changed (a row with restart %v): RestartOnly = %v, want %v", k, row.Restart, got, want)
		}
	}
}

func TestRestartOnly(t *testing.T) {
	cur := Default()
	next := Default()
	next.Policy.Timeout = MustDuration("1m")
	next.Server.MaxConcurrent++
	next.Server.Token = "t0ken"
	next.Tools = Tools{"ev": {URL: "http://127.0.0.1:1/mcp"}}
	next.ToolLimits.Calls = 1
	next.Network.Hosts = nil // as empty as the default's {}
	if keys := RestartOnly(cur, next); len(keys) != 0 {
		t.Errorf("policy, max_concurrent, token, tools and tool_limits changed: %v, want none needing a restart", keys)
	}
	next.Server.Listen = Addr{Network: "tcp", Address: "127.0.0.1:8080"}
	next.StateDir = "/elsewhere"
	next.CgroupParent = "/other"
	next.SeccompHelper = SeccompHelperOff
	reg, err := endpoint.ParseRegistry("registry.example")
	if err != nil {
		t.Fatal(err)
	}
	next.Policy.Registries = append(next.Policy.Registries, reg)
	next.Sessions.TTL = MustDuration("2h")
	want := []string{"policy.registries", "seccomp_helper", "server.listen", "sessions.ttl", "state_dir", "cgroup_parent"}
	if keys := RestartOnly(cur, next); !slices.Equal(keys, want) {
		t.Errorf("RestartOnly = %v, want %v", keys, want)
	}
}

// TestReloadOfTakesTheLongestRow: policy's keys are reloadable but for
// policy.registries.
func TestReloadOfTakesTheLongestRow(t *testing.T) {
	for key, restart := range map[string]bool{"policy.memory": false, "policy.local_images": false, "policy.registries": true,
		"network.services": true, "tool_limits.calls": false, "server.listen": true, "server.quota.concurrent": false} {
		row, ok := ReloadOf(key)
		if !ok || row.Restart != restart || !strings.HasPrefix(key, row.Key) {
			t.Errorf("ReloadOf(%q) = %+v, %v; want a row with restart %v", key, row, ok, restart)
		}
	}
}

func TestNeedsToken(t *testing.T) {
	for _, c := range []struct {
		network, token string
		want           bool
	}{
		{"tcp", "", true},
		{"tcp", "s3cret", false},
		{"unix", "", false},
	} {
		s := Server{Token: c.token}
		if got := s.NeedsToken(c.network); got != c.want {
			t.Errorf("NeedsToken(%q) with token %q = %v, want %v", c.network, c.token, got, c.want)
		}
	}
}
