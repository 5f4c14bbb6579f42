// Package integration runs agentrun for real, as root, with real containers,
// namespaces, cgroups and mounts, and checks every guarantee from inside the
// sandbox and on the host afterwards.
package integration

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/runc"
	"github.com/agentrun/agentrun/runtime/spec"
	"github.com/agentrun/agentrun/test/testenv"
	"github.com/agentrun/agentrun/test/toolprobe"
	"golang.org/x/sys/unix"
)

func init() {
	// The test binary is also each container's init.
	runc.InitHook()
}

var (
	imagesDir = testenv.ImagesDir
	// scope is the suite's own part of the host: its state dir (stateDir),
	// cgroup parents and sandbox uids, apart from any agentrun running
	// beside the suite; its leak checks look there only.
	scope    testenv.Scope
	stateDir string
)

// Images used by the tests, as dir: references.
var pythonImage, busyboxImage string

// runscPath is the runsc binary test/runsc.sh installed.
var runscPath string

// runtimes are the backends every behavioural test runs on.
var runtimes = []string{"libcontainer", "runsc"}

// eachRuntime runs fn as a subtest per runtime.
func eachRuntime(t *testing.T, fn func(t *testing.T, rt string)) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) { fn(t, rt) })
	}
}

// cfgFor is testConfig with rt as the default runtime.
func cfgFor(t testing.TB, rt string) *config.Config {
	cfg := testConfig(t)
	cfg.Runtime = rt
	return cfg
}

// runIn runs the task JSON on runtime rt and checks the host afterwards.
func runIn(t testing.TB, rt, taskJSON string) *result.Result {
	t.Helper()
	return runTaskWith(t, cfgFor(t, rt), nil, taskJSON)
}

// seccompHelper is agentrun-seccomp, for every run of the suite.
var seccompHelper string

func TestMain(m *testing.M) {
	toolprobe.Main() // TestToolServersFenced's hostile tool server
	flag.Parse()
	var err error
	if scope, err = testenv.Setup("integration", *imagesDir, "all", "python", "busybox"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stateDir = scope.StateDir
	if os.Getenv("AGENTRUN_SKIP_RUNSC_BUILD") == "" {
		cmd := exec.Command(filepath.Join(testenv.RepoRoot(), "test", "runsc.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			fmt.Fprintf(os.Stderr, "installing runsc: %v\n", err)
			os.Exit(1)
		}
		runscPath = strings.TrimSpace(string(out))
	}
	if runscPath == "" {
		runscPath = testenv.EnvOr("AGENTRUN_RUNSC", "/var/cache/agentrun/bin/runsc")
	}
	if _, err := os.Stat(runscPath); err != nil {
		fmt.Fprintf(os.Stderr, "runsc missing (test/runsc.sh installs it): %v\n", err)
		os.Exit(1)
	}
	if seccompHelper, err = testenv.SeccompHelper(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pythonImage = "dir:" + filepath.Join(*imagesDir, "python", "rootfs")
	busyboxImage = "dir:" + filepath.Join(*imagesDir, "busybox", "rootfs")
	code := m.Run()
	if code == 0 {
		if leaks := hostLeaks(); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "host not clean after the suite:\n  %s\n", strings.Join(leaks, "\n  "))
			code = 1
		}
	}
	scope.RemoveCgroupParents()
	os.RemoveAll(stateDir)
	os.Exit(code)
}

// testConfig is the default config in the suite's scope (state dir,
// cgroup parent, sandbox uids) and no audit file unless a test asks for
// one.
func testConfig(t testing.TB) *config.Config {
	cfg := config.Default()
	cfg.StateDir = stateDir
	cfg.StoreDir = filepath.Join(stateDir, "store")
	cfg.CgroupParent = scope.CgroupParent
	cfg.RunUIDs.First, cfg.RunUIDs.Count = scope.UIDFirst, scope.UIDCount
	cfg.Audit = ""
	cfg.Image = pythonImage
	// Tasks of the tests name the test images and images they make in
	// temporary directories.
	cfg.Policy.LocalImages = []string{*imagesDir, os.TempDir(), stateDir}
	cfg.Runsc.Path = runscPath
	// The filter compiled once and loaded by the helper, as make build's
	// binary runs it; a missing helper fails the run.
	cfg.SeccompHelper = seccompHelper
	cfg.Runsc.Flags = nil
	return cfg
}

// runTask runs the task JSON on a fresh runner and checks the host is clean
// afterwards.
func runTask(t testing.TB, taskJSON string) *result.Result {
	t.Helper()
	return runTaskWith(t, testConfig(t), nil, taskJSON)
}

func runTaskWith(t testing.TB, cfg *config.Config, log *audit.Log, taskJSON string) *result.Result {
	t.Helper()
	res := runOnly(t, cfg, log, taskJSON)
	if res.Error != "" {
		t.Errorf("run failed: %s", res.Error)
	}
	assertNoLeaks(t)
	return res
}

// runOnly runs the task without checking its error or the host afterwards,
// for tests that expect a failure or run several at once.
func runOnly(t testing.TB, cfg *config.Config, log *audit.Log, taskJSON string) *result.Result {
	t.Helper()
	plan, err := task.Load([]byte(taskJSON), cfg)
	if err != nil {
		t.Errorf("task.Load: %v", err)
		return &result.Result{}
	}
	r, err := compose.Runner(cfg, log)
	if err != nil {
		t.Errorf("compose.Runner: %v", err)
		return &result.Result{}
	}
	return r.Run(context.Background(), plan, runapi.Hooks{})
}

// pyTask returns a task JSON that runs python code with extra top-level
// fields merged in.
func pyTask(code string, extra map[string]any) string {
	m := map[string]any{"code": code, "language": "python"}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// assertNoLeaks fails the test if any run left something on the host.
func assertNoLeaks(t testing.TB) {
	t.Helper()
	if leaks := hostLeaks(); len(leaks) > 0 {
		t.Errorf("host not clean after run:\n  %s", strings.Join(leaks, "\n  "))
	}
}

// hostLeaks lists what runs left: cgroups, mounts, run and container state.
func hostLeaks() []string { return hostLeaksExcept("") }

// hostLeaksExcept is hostLeaks ignoring what belongs to the live run id
// (and the tool servers' parent cgroup that may hold it; the runtimes'
// parents stay anyway).
func hostLeaksExcept(live string) []string { return scope.Leaks(live) }

// lcParent and runscParent are the names, under each cgroup hierarchy's
// root, of the cgroups that hold the suite's libcontainer and runsc runs.
func lcParent() string    { return strings.TrimPrefix(scope.CgroupParent, "/") }
func runscParent() string { return strings.TrimPrefix(scope.RunscCgroupParent(), "/") }

// pythonProgram is in the command line of a Python run's interpreter (its
// code file), and in no other process of a sandbox: not in the interpreter
// that compiles the run launcher, which a serve's first Python run starts.
var pythonProgram = spec.WorkspaceDir + "/" + task.CodeFileName("python")

// waitSandboxProcess waits, up to wait (0: looks once), until a process
// runs as one of the sandbox uids of sc with word in its command line (a
// run's program has started), and reports whether one did.
func waitSandboxProcess(t testing.TB, sc testenv.Scope, word string, wait time.Duration) bool {
	t.Helper()
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		procs, _ := filepath.Glob("/proc/[0-9]*/status")
		for _, p := range procs {
			st, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(st), "\n") {
				f := strings.Fields(line)
				if len(f) < 2 || f[0] != "Uid:" {
					continue
				}
				uid, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil || !sc.HasUID(uid) {
					break
				}
				if cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline")); strings.Contains(string(cmdline), word) {
					return true
				}
			}
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// reapOrphans reaps, until stop is closed, the dead processes of a
// sandbox's uid that were reparented to this process: the runsc backend
// an in-process runner opens makes it a child subreaper, so a serve a
// test SIGKILLs leaves its exec'd processes to this process rather than
// to the host's init, which would reap them; unreaped, they hold their
// sandbox's init in its pid namespace's teardown, and gc after it. Only
// while nothing else of this process's runs: an in-process runner's
// own container inits are children of this process too, and their
// statuses are libcontainer's to wait for.
func reapOrphans(stop <-chan struct{}) {
	self := strconv.Itoa(os.Getpid())
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			st, err := os.ReadFile(p + "/stat")
			if err != nil {
				continue
			}
			i := strings.LastIndexByte(string(st), ')')
			f := strings.Fields(string(st[i+1:]))
			if len(f) < 2 || f[0] != "Z" || f[1] != self {
				continue
			}
			status, err := os.ReadFile(p + "/status")
			if err != nil || !strings.Contains(string(status), "\nUid:\t") || strings.Contains(string(status), "\nUid:\t0\t") {
				continue
			}
			if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
				var ws unix.WaitStatus
				_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			}
		}
	}
}
