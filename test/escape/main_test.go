// Package escape runs agentrun's escape-probe battery: it builds the static
// probe program (test/escape/probe), puts it in a private copy of the
// busybox test image (of the python one for a warm sandbox, whose task's
// code execs it), runs it through internal/runner exactly as
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
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/runtime/runc"
	"github.com/agentrun/agentrun/test/testenv"
)

func init() {
	// The test binary is also each container's init.
	runc.InitHook()
}

var (
	imagesDir = testenv.ImagesDir
	stateDir  string
)

// seccompHelper is agentrun-seccomp, for every run of the suite.
var seccompHelper string

func TestMain(m *testing.M) {
	flag.Parse()
	var err error
	if stateDir, err = testenv.Setup("escape", *imagesDir, "all", "busybox", "python"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if seccompHelper, err = testenv.SeccompHelper(); err != nil {
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
	// The filter compiled once and loaded by the helper, as make build's
	// binary runs it; a missing helper fails the run.
	cfg.SeccompHelper = seccompHelper
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
	for _, root := range testenv.CgroupRoots() {
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
	return append(leaks, testenv.StateLeaks(stateDir, "")...)
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

func assertNoLeaks(t *testing.T) {
	t.Helper()
	if leaks := hostLeaks(); len(leaks) > 0 {
		t.Errorf("host not clean after the run:\n  %s", strings.Join(leaks, "\n  "))
	}
}
