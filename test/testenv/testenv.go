// Package testenv is what agentrun's root test suites (test/integration,
// test/escape) share: the root check, the test images, the state dir, and
// the scan of what runs left on the host.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// EnvOr is the environment variable k, or def when it is unset or empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// DefaultImagesDir is where test/images/build.sh puts the test images.
const DefaultImagesDir = "/var/cache/agentrun/images"

// RepoRoot is the module root, found from this file's path.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Setup is the start of a root suite's TestMain: it fails (never skips)
// without root, runs test/images/build.sh build (not when
// AGENTRUN_SKIP_IMAGE_BUILD is set), checks that each image in need is
// there, and makes the suite's own state dir under /run. Every failure is
// an error for TestMain to print and exit 1 on.
func Setup(suite, imagesDir, build string, need ...string) (stateDir string, err error) {
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%s tests must run as root: they create containers, cgroups, namespaces and mounts", suite)
	}
	if os.Getenv("AGENTRUN_SKIP_IMAGE_BUILD") == "" {
		cmd := exec.Command(filepath.Join(RepoRoot(), "test", "images", "build.sh"), build)
		cmd.Env = append(os.Environ(), "AGENTRUN_IMAGES="+imagesDir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("building the test images (%s): %w", build, err)
		}
	}
	for _, name := range need {
		if _, err := os.Stat(filepath.Join(imagesDir, name, "rootfs", "bin")); err != nil {
			return "", fmt.Errorf("test image missing: %w (run test/images/build.sh %s)", err, name)
		}
	}
	return os.MkdirTemp("/run", "agentrun-"+suite+"-")
}

// CgroupRoots are the places a run's cgroup can appear: each v1 hierarchy,
// or the unified v2 root.
func CgroupRoots() []string {
	var roots []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
	}
	return append(roots, "/sys/fs/cgroup")
}

// StateLeaks lists what runs left under stateDir: mounts, run and
// container state, and runsc's state in its --root (which itself stays).
// What belongs to run live (when not "") is not listed.
func StateLeaks(stateDir, live string) []string {
	var leaks []string
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, stateDir) && (live == "" || !strings.Contains(line, live)) {
				leaks = append(leaks, "mount: "+line)
			}
		}
	}
	for _, sub := range []string{"runs", "runc", "runsc"} {
		entries, _ := os.ReadDir(filepath.Join(stateDir, sub))
		for _, e := range entries {
			if e.Name() != "cgroup.lock" && e.Name() != "root" && (live == "" || e.Name() != live) {
				leaks = append(leaks, "state: "+filepath.Join(stateDir, sub, e.Name()))
			}
		}
	}
	entries, _ := os.ReadDir(filepath.Join(stateDir, "runsc", "root"))
	for _, e := range entries {
		if live == "" || !strings.Contains(e.Name(), live) {
			leaks = append(leaks, "runsc state: "+e.Name())
		}
	}
	return leaks
}
