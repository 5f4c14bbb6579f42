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
