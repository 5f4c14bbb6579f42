package main

import "testing"

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
