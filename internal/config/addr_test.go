package config

import "testing"

func TestParseAddr(t *testing.T) {
	for in, want := range map[string]Addr{
		"unix:///run/agentrun/agentrun.sock": {"unix", "/run/agentrun/agentrun.sock"},
		"tcp://127.0.0.1:8080":               {"tcp", "127.0.0.1:8080"},
		"tcp://[::1]:80":                     {"tcp", "[::1]:80"},
	} {
		got, err := ParseAddr(in)
		if err != nil || got != want || got.String() != in {
			t.Errorf("ParseAddr(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "unix://rel.sock", "unix:///a/../b.sock", "tcp://host", "tcp://host:", "http://x:1", "/run/x.sock"} {
		if a, err := ParseAddr(in); err == nil {
			t.Errorf("ParseAddr(%q) = %+v; want an error", in, a)
		}
	}
}
