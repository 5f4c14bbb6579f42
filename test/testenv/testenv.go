// Package testenv is what agentrun's root tests share: the root check
// (RequireRoot, SkipUnlessRoot); for the suites (test/integration,
// test/escape) the test images, their scope on the host (state dir,
// cgroup parent, sandbox uids: Scope) and the scan of what their runs
// left there; for the namespace
// tests (netns, proxy) the check that links, fds and goroutines are as
// they were.
package testenv

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/internal/uidpool"
)

// EnvOr is the environment variable k, or def when it is unset or empty.
func EnvOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// ImagesDir is the -images flag of the suites: where test/images/build.sh
// puts the test images ($AGENTRUN_IMAGES, or /var/cache/agentrun/images).
var ImagesDir = flag.String("images", EnvOr("AGENTRUN_IMAGES", "/var/cache/agentrun/images"), "directory of the test root filesystems (test/images/build.sh)")

// RepoRoot is the module root, found from this file's path.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// RootEnv, set to 1 (make test sets it), turns the skip of a test that
// needs root into a failure: a suite meant to run as root must not pass
// by skipping.
const RootEnv = "AGENTRUN_TEST_ROOT"

// RootMissing is why a root test cannot run here ("" as root): what
// RequireRoot and the suites' TestMain say.
func RootMissing() string {
	if os.Geteuid() == 0 {
		return ""
	}
	return "needs root (it makes namespaces, cgroups, mounts or sandboxes): run the tests as root, e.g. sudo make test"
}

// RequireRoot skips t, with the reason, unless it runs as root; with
// $AGENTRUN_TEST_ROOT=1 it fails t instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if why := RootMissing(); why != "" {
		if os.Getenv(RootEnv) == "1" {
			t.Fatal(why + " ($" + RootEnv + "=1)")
		}
		t.Skip(why)
	}
}

// SkipUnlessRoot is for the TestMain of a package whose tests all need
// root: not root, it says why and exits, successfully (every test
// skipped), or as a failure with $AGENTRUN_TEST_ROOT=1.
func SkipUnlessRoot(suite string) {
	why := RootMissing()
	if why == "" {
		return
	}
	if os.Getenv(RootEnv) == "1" {
		fmt.Fprintf(os.Stderr, "%s tests: %s ($%s=1)\n", suite, why, RootEnv)
		os.Exit(1)
	}
	fmt.Printf("skipping the %s tests: %s\n", suite, why)
	os.Exit(0)
}

// SeccompHelper is agentrun-seccomp (runtime/runc/seccompexec) for the
// suites' runs: beside $AGENTRUN_BIN when that is set (make's bin/, the
// device bundle), else make build's bin/agentrun-seccomp, built by make
// when it is missing.
func SeccompHelper() (string, error) {
	if bin := os.Getenv("AGENTRUN_BIN"); bin != "" {
		return filepath.Join(filepath.Dir(bin), "agentrun-seccomp"), nil
	}
	const helper = "bin/agentrun-seccomp"
	cmd := exec.Command("make", "--no-print-directory", helper)
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("make %s: %v: %s", helper, err, out)
	}
	return filepath.Join(RepoRoot(), helper), nil
}

// Scope is what one test process's runs use on the host, apart from those
// of any other agentrun (an operator's service with its own state dir,
// another suite's process): a state dir, a cgroup parent and a range of
// sandbox uids of its own. The suites' configs use it (their state_dir,
// cgroup_parent and run_uids; ConfigMap) and their leak checks look at nothing else (Leaks), so that they pass
// beside a running service.
type Scope struct {
	StateDir string
	// CgroupParent holds the libcontainer runs' cgroups (config key
	// cgroup_parent); runsc's are under RunscCgroupParent. It is the
	// product's, with a suffix: a cgroup_parent of its own.
	CgroupParent string
	// UIDFirst and UIDCount are the config's run_uids.
	UIDFirst, UIDCount int64
}

// scopeUIDs is the size of a scope's uid range.
const scopeUIDs = 1024

// NewScope makes suite's scope: a fresh state dir under /run, the cgroup
// parent /agentrun-test-SUITE-PID, and 1,024 uids above uidpool's default
// range, picked by the process id.
func NewScope(suite string) (Scope, error) {
	dir, err := os.MkdirTemp("/run", "agentrun-"+suite+"-")
	if err != nil {
		return Scope{}, err
	}
	pid := int64(os.Getpid())
	return Scope{
		StateDir:     dir,
		CgroupParent: fmt.Sprintf("/agentrun-test-%s-%d", suite, pid),
		UIDFirst:     uidpool.DefaultFirst + uidpool.DefaultCount + pid%1000*scopeUIDs,
		UIDCount:     scopeUIDs,
	}, nil
}

// RunscCgroupParent holds the runsc runs' cgroups, as config's
// RunscCgroupParent names it.
func (s Scope) RunscCgroupParent() string { return s.CgroupParent + "-runsc" }

// ToolsCgroupParent holds the stdio tool servers' cgroups, as config's
// ToolsCgroupParent names it.
func (s Scope) ToolsCgroupParent() string { return s.CgroupParent + "-tools" }

// CgroupParents are the runs' parents, libcontainer's first, and the tool
// servers'.
func (s Scope) CgroupParents() []string {
	return []string{s.CgroupParent, s.RunscCgroupParent(), s.ToolsCgroupParent()}
}

// RemoveCgroupParents removes the scope's cgroup parents where they are
// empty, as `agentrun gc` removes a config's: the end of a suite.
func (s Scope) RemoveCgroupParents() {
	for _, root := range CgroupRoots() {
		for _, name := range s.CgroupParents() {
			_ = os.Remove(filepath.Join(root, name))
		}
	}
}

// ConfigMap sets the scope's cgroup_parent and run_uids in m, a config
// file's keys, where m has none.
func (s Scope) ConfigMap(m map[string]any) {
	if _, ok := m["cgroup_parent"]; !ok {
		m["cgroup_parent"] = s.CgroupParent
	}
	if _, ok := m["run_uids"]; !ok {
		m["run_uids"] = map[string]int64{"first": s.UIDFirst, "count": s.UIDCount}
	}
}

// HasUID reports whether uid is one of the scope's run_uids.
func (s Scope) HasUID(uid int64) bool { return uid >= s.UIDFirst && uid < s.UIDFirst+s.UIDCount }

// Leaks lists what the scope's runs left on the host: cgroups under its
// parents (and the tool servers' parent itself), and what StateLeaks
// lists. What belongs to run live (when not "") is not listed, nor then
// the tools' parent. The runtimes' parents stay once made, as agentrun
// keeps them (RemoveCgroupParents removes them).
func (s Scope) Leaks(live string) []string {
	var leaks []string
	for _, root := range CgroupRoots() {
		for _, name := range s.CgroupParents() {
			parent := filepath.Join(root, name)
			if st, err := os.Stat(parent); err != nil || !st.IsDir() {
				continue
			}
			if live == "" && name == s.ToolsCgroupParent() {
				leaks = append(leaks, "cgroup "+parent)
			}
			entries, _ := os.ReadDir(parent)
			for _, e := range entries {
				if e.IsDir() && e.Name() != live {
					leaks = append(leaks, "cgroup "+filepath.Join(parent, e.Name()))
				}
			}
		}
	}
	return append(leaks, s.StateLeaks(live)...)
}

// Setup is the start of a root suite's TestMain: not root, it skips the
// suite (SkipUnlessRoot); it runs test/images/build.sh build (not when
// AGENTRUN_SKIP_IMAGE_BUILD is set), checks that each image in need is
// there, and makes the suite's scope. Every failure is an error for
// TestMain to print and exit 1 on.
func Setup(suite, imagesDir, build string, need ...string) (Scope, error) {
	SkipUnlessRoot(suite)
	if os.Getenv("AGENTRUN_SKIP_IMAGE_BUILD") == "" {
		cmd := exec.Command(filepath.Join(RepoRoot(), "test", "images", "build.sh"), build)
		cmd.Env = append(os.Environ(), "AGENTRUN_IMAGES="+imagesDir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return Scope{}, fmt.Errorf("building the test images (%s): %w", build, err)
		}
	}
	for _, name := range need {
		if _, err := os.Stat(filepath.Join(imagesDir, name, "rootfs", "bin")); err != nil {
			return Scope{}, fmt.Errorf("test image missing: %w (run test/images/build.sh %s)", err, name)
		}
	}
	return NewScope(suite)
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

// StateLeaks lists what the scope's runs left under its state dir:
// mounts, run and container state, session mount points, runsc's state in
// its --root (which itself stays), uid reservations and processes running
// as one of its uids. What belongs to run live (when not "") is not
// listed.
func (s Scope) StateLeaks(live string) []string {
	stateDir := s.StateDir
	var leaks []string
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, stateDir) && (live == "" || !strings.Contains(line, live)) {
				leaks = append(leaks, "mount: "+line)
			}
		}
	}
	// sessions: the mount points of host-side accesses to sessions.
	for _, sub := range []string{"runs", "runc", "runsc", "sessions"} {
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
	// Reservations of sandbox and tool server uids by runs of this state
	// dir (a tool server's owner is its run's dir, then its name) and by
	// its shared tool servers (their lock in the tools dir), among the
	// host's (internal/uidpool), and processes still running as one of
	// the scope's uids.
	liveUID := ""
	uids, _ := os.ReadDir(uidpool.DefaultDir)
	for _, e := range uids {
		owner, _ := os.Readlink(filepath.Join(uidpool.DefaultDir, e.Name()))
		runs, tools := filepath.Join(stateDir, "runs"), filepath.Join(stateDir, "tools")
		if up := filepath.Dir(filepath.Dir(owner)); up == runs || up == tools {
			if live == "" || filepath.Base(filepath.Dir(owner)) != live {
				leaks = append(leaks, "tool server uid reservation: "+e.Name()+" -> "+owner)
			}
			continue
		}
		if filepath.Dir(owner) != runs {
			continue // another agentrun's
		}
		if live != "" && filepath.Base(owner) == live {
			liveUID = e.Name()
			continue
		}
		leaks = append(leaks, "uid reservation: "+e.Name()+" -> "+owner)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || strings.Contains(string(b), "\nState:\tZ") {
			continue // gone, or a zombie its reaper is about to take
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] != "Uid:" {
				continue
			}
			if uid, err := strconv.ParseInt(f[1], 10, 64); err == nil && s.HasUID(uid) && f[1] != liveUID {
				leaks = append(leaks, "process as a sandbox uid: "+p+" uid "+f[1])
			}
		}
	}
	// Loop devices backed by a file under the state dir (session disks).
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if f, err := os.ReadFile(b); err == nil && strings.HasPrefix(string(f), stateDir+"/") {
			leaks = append(leaks, "loop device: "+b+" -> "+strings.TrimSpace(string(f)))
		}
	}
	return leaks
}

// Snapshot is what a root test of namespaces must find the same after
// tearing down what it made: host links, this process's fds and goroutines.
type Snapshot struct {
	links      map[string]bool
	fds        int
	goroutines int
}

// TakeSnapshot records the host's links and this process's fds and
// goroutines.
func TakeSnapshot(t testing.TB) Snapshot {
	t.Helper()
	// The watch of the host's addresses, which the first proxy dial or
	// image pull starts, lives as long as the process: counted before.
	hostaddr.Watch()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatalf("listing host links: %v", err)
	}
	s := Snapshot{links: map[string]bool{}, goroutines: runtime.NumGoroutine()}
	for _, l := range links {
		s.links[fmt.Sprintf("%d:%s", l.Attrs().Index, l.Attrs().Name)] = true
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	s.fds = len(ents)
	return s
}

// HasLink reports whether the host had link name, with that index, then.
func (s Snapshot) HasLink(index int, name string) bool {
	return s.links[fmt.Sprintf("%d:%s", index, name)]
}

// FixtureLinkPrefix starts the name of every host link a test makes for
// itself (a fake Internet's veth, a veth that gives the host an address):
// go test runs packages in parallel processes, so a leak check passes over
// these, which another package's test may be making at the same time.
// Tests in packages this one imports spell it out ("art-").
const FixtureLinkPrefix = "art-"

// NoLeaks records the host's links and this process's fds and goroutines
// now and, when t ends, checks them as CheckNoLeak does: after the test's
// deferred calls and the clean-ups registered after it, so that a test
// that fails half-way is checked too. It returns what it recorded.
func NoLeaks(t testing.TB) Snapshot {
	t.Helper()
	before := TakeSnapshot(t)
	t.Cleanup(func() { CheckNoLeak(t, before) })
	return before
}

// CheckNoLeak compares the host and this process with before, waiting a
// little for goroutines to end. Links named with FixtureLinkPrefix are
// other tests' fixtures and are passed over.
func CheckNoLeak(t testing.TB, before Snapshot) {
	t.Helper()
	var after Snapshot
	deadline := time.Now().Add(5 * time.Second)
	for {
		after = TakeSnapshot(t)
		if after.goroutines <= before.goroutines && after.fds <= before.fds || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	for l := range after.links {
		if !before.links[l] && !strings.Contains(l, ":"+FixtureLinkPrefix) {
			t.Errorf("host link %s appeared", l)
		}
	}
	if after.fds > before.fds {
		t.Errorf("open fds: %d before, %d after", before.fds, after.fds)
	}
	if after.goroutines > before.goroutines {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after\n%s", before.goroutines, after.goroutines, buf[:runtime.Stack(buf, true)])
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil && len(ents) > 0 {
		for _, e := range ents {
			t.Logf("/run/netns/%s exists (possibly not ours)", e.Name())
		}
	}
}

// Zombies lists the children of process pid that have exited and were
// not reaped, as "pid (comm)".
func Zombies(pid int) []string {
	var out []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		s := string(b)
		end := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[end+1:])
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(pid) {
			out = append(out, s[:end+1])
		}
	}
	return out
}

// Sleeper starts a child that sleeps for a minute and opens a pidfd of
// it: the child is killed and reaped, and the pidfd closed, when t ends.
func Sleeper(t testing.TB) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command("/bin/sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatalf("pidfd_open: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return cmd, fd
}
