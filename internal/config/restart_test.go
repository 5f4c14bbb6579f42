package config

import (
	"slices"
	"testing"

	"github.com/agentrun/agentrun/image"
)

func TestRestartOnly(t *testing.T) {
	cur := Default()
	next := Default()
	next.Policy.Timeout = MustDuration("1m")
	next.Server.MaxConcurrent++
	next.Server.Token = "t0ken"
	if keys := RestartOnly(cur, next); len(keys) != 0 {
		t.Errorf("policy, max_concurrent and token changed: %v, want none needing a restart", keys)
	}
	next.Server.Listen = Addr{Network: "tcp", Address: "127.0.0.1:8080"}
	next.StateDir = "/elsewhere"
	reg, err := image.ParseRegistry("registry.example")
	if err != nil {
		t.Fatal(err)
	}
	next.Policy.Registries = append(next.Policy.Registries, reg)
	want := []string{"server.listen", "state_dir", "policy.registries"}
	if keys := RestartOnly(cur, next); !slices.Equal(keys, want) {
		t.Errorf("RestartOnly = %v, want %v", keys, want)
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
