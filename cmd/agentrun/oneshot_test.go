package main

import (
	"os"
	"runtime"
	"testing"
)

// TestOneShotProcs: a one-shot run passes GOMAXPROCS=1 on to its
// container's init, unless the operator set it, and keeps its own Ps.
func TestOneShotProcs(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })

	t.Setenv("GOMAXPROCS", "3")
	oneShotProcs()
	if got := os.Getenv("GOMAXPROCS"); got != "3" {
		t.Errorf("the operator's GOMAXPROCS=3 became %q", got)
	}
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Errorf("GOMAXPROCS set by the operator, yet the process has %d Ps (was %d)", got, procs)
	}

	os.Unsetenv("GOMAXPROCS") // t.Setenv restores it after the test
	oneShotProcs()
	if got := os.Getenv("GOMAXPROCS"); got != "1" {
		t.Errorf("GOMAXPROCS for the container's init = %q; want 1", got)
	}
	if got := runtime.GOMAXPROCS(0); got != procs {
		t.Errorf("the process has %d Ps; want its own %d", got, procs)
	}
}
