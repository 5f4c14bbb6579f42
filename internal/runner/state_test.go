package runner

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStateModule runs testdata/state_check.py on the host's python3
// against state.py: globals of every kind round-trip (functions, lambdas,
// closures and classes by value, modules by name, shared objects shared),
// what cannot be pickled is named, and a state past its cap is not kept.
func TestStateModule(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed (Debian's python3): %v", err)
	}
	out, err := exec.Command(py, "testdata/state_check.py", "state.py").CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("state_check.py: %v\n%s", err, out)
	}
}
