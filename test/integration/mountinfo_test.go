package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMountinfoShowsNoHostPaths reads /proc/self/mountinfo in a sandbox
// of each runtime: the init and agentrun-seccomp are bound from a path
// that says nothing of the host, so neither's host path, nor the
// directory of the agentrun binary, shows there.
func TestMountinfoShowsNoHostPaths(t *testing.T) {
	cfg := testConfig(t)
	hostPaths := []string{cfg.Init, seccompHelper, filepath.Dir(seccompHelper)}
	for _, p := range []string{cfg.Init, seccompHelper} {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			hostPaths = append(hostPaths, real, filepath.Dir(real))
		}
	}
	if bin := os.Getenv("AGENTRUN_BIN"); bin != "" {
		hostPaths = append(hostPaths, filepath.Dir(bin))
	}
	eachRuntime(t, func(t *testing.T, rt string) {
		res := runIn(t, rt, pyTask("print(open('/proc/self/mountinfo').read())", nil))
		if res.ExitCode != 0 || !strings.Contains(res.Stdout, " /dev/init ") {
			t.Fatalf("mountinfo: exit %d stdout %q stderr %q; want the sandbox's mounts, /dev/init among them", res.ExitCode, res.Stdout, res.Stderr)
		}
		for _, line := range strings.Split(res.Stdout, "\n") {
			for _, p := range hostPaths {
				if strings.Contains(line, p) {
					t.Errorf("mountinfo line %q shows host path %s", line, p)
					break
				}
			}
		}
	})
}
