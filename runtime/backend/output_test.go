package backend

import (
	"bytes"
	"os"
	"testing"
)

func TestCaptureKeepsLimitAndCountsAll(t *testing.T) {
	for _, tc := range []struct {
		n, limit  int
		truncated bool
	}{{0, 10, false}, {10, 10, false}, {11, 10, true}, {1 << 20, 1024, true}, {100, 0, true}} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		data := bytes.Repeat([]byte("x"), tc.n)
		go func() { w.Write(data); w.Close() }()
		out := Capture(r, int64(tc.limit), "stdout", nil)
		if out.Total != int64(tc.n) || len(out.Data) != min(tc.n, tc.limit) || out.Truncated != tc.truncated {
			t.Errorf("Capture(%d bytes, limit %d) = total %d kept %d truncated %v", tc.n, tc.limit, out.Total, len(out.Data), out.Truncated)
		}
	}
}

func TestKilledAtDeadline(t *testing.T) {
	for sig, want := range map[string]bool{"SIGKILL": true, "": false, "SIGTERM": false, "SIGSEGV": false} {
		if got := KilledAtDeadline(&Outcome{Signal: sig, ExitCode: 137}); got != want {
			t.Errorf("signal %q: %v; want %v", sig, got, want)
		}
	}
}
