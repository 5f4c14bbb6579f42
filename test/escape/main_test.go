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
	"strings"
	"testing"

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
	// scope is the suite's own part of the host (state dir, cgroup
	// parents, sandbox uids), where its leak checks look.
	scope    testenv.Scope
	stateDir string
)

// seccompHelper is agentrun-seccomp, for every run of the suite.
var seccompHelper string

func TestMain(m *testing.M) {
	flag.Parse()
	var err error
	if scope, err = testenv.Setup("escape", *imagesDir, "all", "busybox", "python"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stateDir = scope.StateDir
	if seccompHelper, err = testenv.SeccompHelper(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if leaks := hostLeaks(); len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "host not clean after the suite:\n  %s\n", strings.Join(leaks, "\n  "))
		code = 1
	}
	scope.RemoveCgroupParents()
	os.RemoveAll(stateDir)
	os.Exit(code)
}

// testConfig is the default config in this suite's scope (state dir,
// cgroup parent, sandbox uids) and no audit file.
func testConfig() *config.Config {
	cfg := config.Default()
	cfg.StateDir = stateDir
	cfg.StoreDir = filepath.Join(stateDir, "store")
	cfg.CgroupParent = scope.CgroupParent
	cfg.RunUIDs.First, cfg.RunUIDs.Count = scope.UIDFirst, scope.UIDCount
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

// hostLeaks lists what this suite's runs left: cgroups under its own
// parents, mounts, run and container state, uid reservations and
// processes as its uids.
func hostLeaks() []string { return scope.Leaks("") }

func assertNoLeaks(t *testing.T) {
	t.Helper()
	if leaks := hostLeaks(); len(leaks) > 0 {
		t.Errorf("host not clean after the run:\n  %s", strings.Join(leaks, "\n  "))
	}
}
