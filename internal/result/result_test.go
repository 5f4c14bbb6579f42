package result

import "testing"

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Result
		want int
	}{
		{"ok", Result{}, 0},
		{"program exit", Result{ExitCode: 3}, 3},
		{"signal", Result{ExitCode: 139, Signal: "SIGSEGV"}, 139},
		{"timeout", Result{ExitCode: 137, TimedOut: true}, ExitTimeout},
		{"oom", Result{ExitCode: 137, OOMKilled: true}, ExitKilled},
		{"setup error", Result{Error: "bad task", TimedOut: true}, ExitSetup},
	} {
		if got := tc.r.ExitStatus(); got != tc.want {
			t.Errorf("%s: ExitStatus() = %d; want %d", tc.name, got, tc.want)
		}
	}
}
