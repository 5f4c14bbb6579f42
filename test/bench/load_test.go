package main

import (
	"strings"
	"testing"
)

// TestRoundSpread: the ratios are paired by round; fewer than two rounds
// give no spread.
func TestRoundSpread(t *testing.T) {
	if got := roundSpread([]float64{10, 12, 9}, []float64{20, 20, 30}); got != " (rounds 0.30–0.60×)" {
		t.Errorf("roundSpread = %q", got)
	}
	if got := roundSpread([]float64{10}, []float64{20}); got != "" {
		t.Errorf("one round: %q", got)
	}
}

// TestCheckSealable: a binary whose directory holds the work dir is
// refused; one beside it or elsewhere is not.
func TestCheckSealable(t *testing.T) {
	for bin, ok := range map[string]bool{
		"/tmp/agentrun":           false,
		"/tmp/x/agentrun":         true,
		"/var/tmp/arb/agentrun":   true,
		"/tmp/work/agentrun":      false,
		"/tmp/workspace/agentrun": true,
		"":                        true,
	} {
		if err := checkSealable(bin, "/tmp/work/state"); (err == nil) != ok {
			t.Errorf("checkSealable(%q): %v", bin, err)
		}
	}
}

// TestInTurn: contenders in order, then reversed, then in order again;
// the caller's slice untouched.
func TestInTurn(t *testing.T) {
	xs := []string{"a", "b", "c"}
	for turn, want := range []string{"abc", "cba", "abc", "cba"} {
		if got := strings.Join(inTurn(xs, turn), ""); got != want {
			t.Errorf("turn %d: %s, want %s", turn, got, want)
		}
	}
	if strings.Join(xs, "") != "abc" {
		t.Errorf("the contenders became %v", xs)
	}
}
