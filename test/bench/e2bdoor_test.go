package main

import (
	"testing"
	"time"
)

// TestPairedDiff: the layer's cost is the median of the runs' pairwise
// differences, not the difference of the medians (here 0).
func TestPairedDiff(t *testing.T) {
	ms := time.Millisecond
	a := []time.Duration{10 * ms, 50 * ms, 31 * ms}
	b := []time.Duration{9 * ms, 48 * ms, 30 * ms}
	if got := pairedDiff(a, b); got != ms {
		t.Errorf("pairedDiff = %v, want 1ms", got)
	}
	if got := pairedDiff(a, b[:2]); got != 2*ms {
		t.Errorf("pairedDiff of unequal runs = %v, want 2ms (the pairs there are)", got)
	}
}
