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
	for _, check := range []string{"root", "kernel", "user namespaces", "unprivileged bpf", "io_uring", "modules", "cgroups", "seccomp", "filesystems", "namespaces", "runsc", "seccomp helper", "state dir", "binary seal", "store dir", "run uids", "clock", "image"} {
		if !strings.Contains(string(out), "\n"+check+" ") {
			t.Errorf("doctor output lacks the %q check:\n%s", check, out)
		}
	}
	if strings.Contains(string(out), "FAIL") {
		t.Errorf("doctor reports a failure on the CI host:\n%s", out)
	}
	// make build's helper, beside the binary: the filter compiles once.
	if c := doctorChecks(string(out))["seccomp helper"]; c[0] != "ok" || !strings.HasSuffix(c[1], "agentrun-seccomp: the filter compiles once per process") {
		t.Errorf("doctor: the seccomp helper is not used: %q", c)
	}
	if !strings.Contains(string(out), "sealed read-only through overlayfs") {
		t.Errorf("doctor: the binary is not sealed through overlayfs here:\n%s", out)
	}

	// A binary whose directory holds the state dir: overlayfs cannot seal
	// it (overlapping layers), libcontainer would copy it for every
	// container, and doctor says so, with the fix.
	inside := t.TempDir()
	copied := filepath.Join(inside, "agentrun")
	if out, err := exec.Command("cp", bin, copied).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	nested := writeConfig(t, map[string]any{"image": busyboxImage, "state_dir": filepath.Join(inside, "state"), "store_dir": filepath.Join(dir, "store")})
	out, err = exec.Command(copied, "doctor", "--config", nested).CombinedOutput()
	if err != nil {
		t.Fatalf("doctor with the state dir under the binary's: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "copies its") || !strings.Contains(string(out), "does not hold state_dir") {
		t.Errorf("doctor does not warn of the copy per container, with its fix:\n%s", out)
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
