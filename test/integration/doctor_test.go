package integration

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestDoctor(t *testing.T) {
	bin := agentrunBin(t)
	dir := t.TempDir()
	good := writeConfig(t, map[string]any{"image": busyboxImage, "state_dir": stateDir, "store_dir": filepath.Join(dir, "store")})
	out, err := exec.Command(bin, "doctor", "--config", good).CombinedOutput()
	if err != nil {
		t.Fatalf("doctor on this host: %v\n%s", err, out)
	}
	for _, check := range []string{"root", "kernel", "cgroups", "seccomp", "filesystems", "namespaces", "runsc", "state dir", "store dir", "run uids", "clock", "image"} {
		if !strings.Contains(string(out), "\n"+check+" ") {
			t.Errorf("doctor output lacks the %q check:\n%s", check, out)
		}
	}
	if strings.Contains(string(out), "FAIL") {
		t.Errorf("doctor reports a failure on the CI host:\n%s", out)
	}

	// A state dir that cannot be made: FAIL with a fix naming the key, exit 1.
	bad := writeConfig(t, map[string]any{"state_dir": "/proc/agentrun-doctor"})
	out, err = exec.Command(bin, "doctor", "--config", bad).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("doctor with a bad state dir: err %v; want exit 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "FAIL") || !strings.Contains(string(out), "state_dir") {
		t.Errorf("doctor output does not name the failure and its fix:\n%s", out)
	}
	assertNoLeaks(t)
}
