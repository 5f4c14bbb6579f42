// Package escape runs agentrun's escape-probe battery: it builds the static
// probe program (test/escape/probe), puts it in a private copy of the
// busybox test image, runs it through internal/runner exactly as
// agentrun runs a task, and fails for every way out the probe found open and
// every positive control that did not work. The host is checked clean and
// unchanged afterwards.
//
// As root (these tests fail, never skip, without it):
//
//	CGO_ENABLED=1 go test -tags seccomp -count=1 -v ./test/escape/
//
// AGENTRUN_ESCAPE_RUNTIME picks the runtime (default libcontainer; runsc
// with AGENTRUN_RUNSC naming its binary if it is not the config default);
// AGENTRUN_ESCAPE_REPORT=DIR/NAME.md writes each runtime's report as a
// markdown table to DIR/NAME-<runtime>.md.
package escape

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/runtime/runc"
)

func init() {
	// The test binary is also each container's init.
	runc.InitHook()
}

var (
	imagesDir = flag.String("images", envOr("AGENTRUN_IMAGES", "/var/cache/agentrun/images"), "directory of the test root filesystems (test/images/build.sh)")
	stateDir  string
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// repoRoot is the module root, found from this file's path.
func repoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func TestMain(m *testing.M) {
	flag.Parse()
	// These tests need root; without it they fail, loudly, never skip.
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "escape tests must run as root: they create containers, cgroups, namespaces and mounts")
		os.Exit(1)
	}
	if os.Getenv("AGENTRUN_SKIP_IMAGE_BUILD") == "" {
		cmd := exec.Command(filepath.Join(repoRoot(), "test", "images", "build.sh"), "busybox")
		cmd.Env = append(os.Environ(), "AGENTRUN_IMAGES="+*imagesDir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building the busybox test image: %v\n", err)
			os.Exit(1)
		}
	}
	if _, err := os.Stat(filepath.Join(*imagesDir, "busybox", "rootfs", "bin", "busybox")); err != nil {
		fmt.Fprintf(os.Stderr, "test image missing: %v (run test/images/build.sh busybox)\n", err)
		os.Exit(1)
	}
	var err error
	if stateDir, err = os.MkdirTemp("/run", "agentrun-escape-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if leaks := hostLeaks(); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "host not clean after the suite:\n  %s\n", strings.Join(leaks, "\n  "))
		code = 1
	}
	os.RemoveAll(stateDir)
	os.Exit(code)
}

// testConfig is the default config with this suite's state dir and no audit
// file.
func testConfig() *config.Config {
	cfg := config.Default()
	cfg.StateDir = stateDir
	cfg.StoreDir = filepath.Join(stateDir, "store")
	cfg.Audit = ""
	cfg.Policy.LocalImages = []string{os.TempDir()}
	// runsc as test/runsc.sh installs it, unless told otherwise.
	cfg.Runsc.Path = "/var/cache/agentrun/bin/runsc"
	cfg.Runsc.Flags = nil
	if p := os.Getenv("AGENTRUN_RUNSC"); p != "" {
		cfg.Runsc.Path = p
	}
	return cfg
}

// runIDs are the ids of this suite's runs, for hostLeaks.
var (
	runIDsMu sync.Mutex
	runIDs   []string
)

func addRunID(id string) {
	runIDsMu.Lock()
	defer runIDsMu.Unlock()
	runIDs = append(runIDs, id)
}

// hostLeaks lists what this suite's runs left: their cgroups, mounts, run
// and container state. The shared "agentrun" parent cgroup counts only when
// it stays empty of runs: other suites (test/integration) may be running
// containers on this host at the same time.
func hostLeaks() []string {
	runIDsMu.Lock()
	ids := slices.Clone(runIDs)
	runIDsMu.Unlock()
	var leaks []string
	for _, root := range cgroupRoots() {
		parent := filepath.Join(root, "agentrun")
		for _, id := range ids {
			if _, err := os.Stat(filepath.Join(parent, id)); err == nil {
				leaks = append(leaks, "cgroup "+filepath.Join(parent, id))
			}
		}
		if emptyParentStays(parent) {
			leaks = append(leaks, "cgroup "+parent+" (empty)")
		}
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, stateDir) {
				leaks = append(leaks, "mount: "+line)
			}
		}
	}
	for _, sub := range []string{"runs", "runc", "runsc"} {
		entries, _ := os.ReadDir(filepath.Join(stateDir, sub))
		for _, e := range entries {
			if e.Name() != "cgroup.lock" && e.Name() != "root" {
				leaks = append(leaks, "state: "+filepath.Join(stateDir, sub, e.Name()))
			}
		}
	}
	// runsc's --root stays; what runsc keeps in it must not.
	entries, _ := os.ReadDir(filepath.Join(stateDir, "runsc", "root"))
	for _, e := range entries {
		leaks = append(leaks, "runsc state: "+e.Name())
	}
	return leaks
}

// emptyParentStays reports whether the shared parent cgroup exists without
// any run in it, three times over 600 ms (a concurrent run may be creating
// or removing it).
func emptyParentStays(parent string) bool {
	for i := 0; i < 3; i++ {
		if i > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		entries, err := os.ReadDir(parent)
		if err != nil {
			return false
		}
		for _, e := range entries {
			if e.IsDir() {
				return false
			}
		}
	}
	return true
}

// cgroupRoots are the places a run's cgroup can appear: each v1 hierarchy,
// or the unified v2 root.
func cgroupRoots() []string {
	var roots []string
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range entries {
		roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
	}
	return append(roots, "/sys/fs/cgroup")
}

func assertNoLeaks(t *testing.T) {
	t.Helper()
	if leaks := hostLeaks(); len(leaks) > 0 {
		t.Errorf("host not clean after the run:\n  %s", strings.Join(leaks, "\n  "))
	}
}
