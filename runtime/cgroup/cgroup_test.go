package cgroup

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/test/testenv"
)

// parent holds this package's test cgroups, apart from agentrun's.
const parent = "/agentrun-cgroup-test"

func TestMain(m *testing.M) {
	testenv.SkipUnlessRoot("cgroup")
	code := m.Run()
	if left, _ := filepath.Glob("/sys/fs/cgroup/*" + parent); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "cgroups left: %v\n", left)
		code = 1
	}
	if left, _ := filepath.Glob("/sys/fs/cgroup" + parent); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "cgroups left: %v\n", left)
		code = 1
	}
	os.Exit(code)
}

// newTest creates a cgroup for t with a pids and a memory limit, removed
// (with the parent) when t ends.
func newTest(t *testing.T, pids, memory int64) *Cgroup {
	t.Helper()
	cg, err := New(parent+"/"+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")), &specs.LinuxResources{
		Pids:   &specs.LinuxPids{Limit: &pids},
		Memory: &specs.LinuxMemory{Limit: &memory, Swap: &memory},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cg.Kill(); err != nil {
			t.Error(err)
		}
		if err := cg.Remove(); err != nil {
			t.Error(err)
		}
		cg.RemoveParent()
	})
	return cg
}

// start runs script under sh in cg: sh waits for a line on stdin, which
// it gets once it is in the cgroup, in every hierarchy.
func start(t *testing.T, cg *Cgroup, script string) *exec.Cmd {
	t.Helper()
	cmd, _ := startIn(t, cg, script)
	return cmd
}

// startIn is start that also returns sh's stdin, for the lines script
// reads after the first.
func startIn(t *testing.T, cg *Cgroup, script string) (*exec.Cmd, io.Writer) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", "read x; "+script)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	added := 0
	for _, d := range cg.dirs {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		added++
	}
	if added == 0 {
		t.Fatalf("no directory of cgroup %s exists: %v", cg.path, cg.dirs)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	return cmd, in
}

// TestKillForkingTree: a tree that forks without end, each child
// orphaned at once (out of reach of a kill of the parent's group), is
// killed whole, and the cgroup can then be removed.
func TestKillForkingTree(t *testing.T) {
	cg := newTest(t, 32, 64<<20)
	if !Unified() && cg.freezer == "" {
		t.Fatal("no v1 freezer hierarchy found: the kill cannot freeze the tree")
	}
	cmd := start(t, cg, "while :; do (sleep 100 &); done")
	for deadline := time.Now().Add(10 * time.Second); len(cg.Pids()) < 16; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tree did not grow: %d processes", len(cg.Pids()))
		}
	}
	if err := cg.Kill(); err != nil {
		t.Fatal(err)
	}
	if left := cg.Pids(); len(left) > 0 {
		t.Fatalf("processes left after Kill: %v", left)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("sh ended with %v; want killed", err)
	}
	if err := cg.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range cg.dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s left after Remove", d)
		}
	}
}

// TestUsage: cpu time and peak memory are read; a run within its memory
// limit is not reported OOM-killed.
func TestUsage(t *testing.T) {
	cg := newTest(t, 16, 64<<20)
	cmd := start(t, cg, "dd if=/dev/zero of=/dev/null bs=16M count=16")
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	u := cg.Usage()
	if u.CPU <= 0 || u.MemoryPeak < 16<<20 || u.MemoryPeak > 64<<20 || u.OOMKilled {
		t.Errorf("usage %+v; want cpu > 0, peak between 16 and 64 MiB, not OOM-killed", u)
	}
}

// TestUsageFromStart: after Start, Usage reports the cpu time and the
// peak memory of what ran since, not of what ran before (a sandbox's
// set-up): a first phase that copies 2 GiB through a 64 MiB buffer is
// left out of the cpu time and the peak of a second that copies 16 MiB
// through a 1 MiB one. On v2 the peak is the whole cgroup's where the
// kernel cannot reset memory.peak (before 6.12); the cpu time is checked
// there too.
func TestUsageFromStart(t *testing.T) {
	cg := newTest(t, 16, 128<<20)
	marker := filepath.Join(t.TempDir(), "set-up done")
	cmd, in := startIn(t, cg, "dd if=/dev/zero of=/dev/null bs=64M count=32 2>/dev/null; : >'"+marker+"'; read y; dd if=/dev/zero of=/dev/null bs=1M count=16 2>/dev/null")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the set-up phase did not end")
		}
	}
	before := cg.Usage()
	if before.CPU <= 0 || before.MemoryPeak < 64<<20 {
		t.Fatalf("usage of the set-up phase %+v; want cpu > 0, peak at least 64 MiB", before)
	}
	cg.Start()
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	u := cg.Usage()
	if u.CPU <= 0 || u.CPU > before.CPU/4 {
		t.Errorf("cpu since Start %v; want above 0 and well below the set-up's %v", u.CPU, before.CPU)
	}
	if Unified() && cg.peakFD < 0 {
		t.Logf("this kernel cannot reset memory.peak: the peak (%d MiB) is the whole cgroup's", u.MemoryPeak>>20)
	} else if u.MemoryPeak <= 0 || u.MemoryPeak > 32<<20 {
		t.Errorf("peak since Start %d MiB; want above 0 and below 32 MiB (the set-up's was %d MiB)", u.MemoryPeak>>20, before.MemoryPeak>>20)
	}
	t.Logf("set-up: cpu %v, peak %d MiB; since Start: cpu %v, peak %d KiB", before.CPU, before.MemoryPeak>>20, u.CPU, u.MemoryPeak>>10)
}

// TestUsageOOM: a process past the memory limit is OOM-killed, and Usage
// says so.
func TestUsageOOM(t *testing.T) {
	cg := newTest(t, 16, 16<<20)
	cmd := start(t, cg, "dd if=/dev/zero of=/dev/null bs=64M count=1")
	if err := cmd.Wait(); err == nil {
		t.Fatal("dd of 64 MiB ran to its end under a 16 MiB limit")
	}
	u := cg.Usage()
	if !u.OOMKilled || u.MemoryPeak < 8<<20 {
		t.Errorf("usage %+v; want OOM-killed, peak near 16 MiB", u)
	}
	// On v1 New's eventfd fired (on v2 memory.events is all there is).
	if Unified() != (cg.oomFD < 0) {
		t.Fatalf("oom eventfd %d on a host with cgroup v2 %v", cg.oomFD, Unified())
	}
	if cg.oomFD >= 0 {
		var n [8]byte
		if _, err := unix.Read(cg.oomFD, n[:]); err != nil {
			t.Errorf("reading the oom eventfd: %v", err)
		}
	}
	// Open's handle, without New's OOM notification, reads the same.
	opened, err := Open(cg.path)
	if err != nil {
		t.Fatal(err)
	}
	if u := opened.Usage(); !u.OOMKilled {
		t.Errorf("usage through Open %+v; want OOM-killed", u)
	}
}

// TestNewLimits: New writes the memory (swap = memory), cpu and pids
// limits into the cgroup's files, in each hierarchy that has them, and
// leaves the devices it may use alone.
func TestNewLimits(t *testing.T) {
	mem, pids, quota, period := int64(48<<20), int64(37), int64(50000), uint64(100000)
	cg, err := New(parent+"/limits", &specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &mem, Swap: &mem},
		CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
		Pids:   &specs.LinuxPids{Limit: &pids},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cg.Remove(); err != nil {
			t.Error(err)
		}
		cg.RemoveParent()
	})
	read := func(dir, file string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	want := map[string]string{}
	if Unified() {
		d := cg.dirs[0]
		want = map[string]string{
			d + "/memory.max": "50331648", d + "/memory.swap.max": "0",
			d + "/pids.max": "37", d + "/cpu.max": "50000 100000",
		}
	} else {
		want[cg.memory+"/memory.limit_in_bytes"] = "50331648"
		if _, err := os.Stat(filepath.Join(cg.memory, "memory.memsw.limit_in_bytes")); err == nil {
			want[cg.memory+"/memory.memsw.limit_in_bytes"] = "50331648"
		}
		for _, d := range cg.dirs {
			switch {
			case strings.HasSuffix(filepath.Dir(filepath.Dir(d)), "/pids"):
				want[d+"/pids.max"] = "37"
			case strings.Contains(filepath.Base(filepath.Dir(filepath.Dir(d))), "cpu") && exists(d+"/cpu.cfs_quota_us"):
				want[d+"/cpu.cfs_quota_us"] = "50000"
				want[d+"/cpu.cfs_period_us"] = "100000"
			case strings.HasSuffix(filepath.Dir(filepath.Dir(d)), "/devices") && exists(d):
				want[d+"/devices.list"] = "a *:* rwm"
			}
		}
	}
	if !Unified() && (cg.freezer == "" || !exists(cg.freezer)) {
		t.Errorf("no freezer cgroup (%q), which Kill needs", cg.freezer)
	}
	if len(want) < 4 {
		t.Fatalf("found too few of the cgroup's files to check: %v (dirs %v)", want, cg.dirs)
	}
	for f, v := range want {
		if got := read(filepath.Dir(f), filepath.Base(f)); got != v {
			t.Errorf("%s = %q; want %q", f, got, v)
		}
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestRemoveTree: Remove takes child cgroups too, and RemoveParent keeps
// the parent while another cgroup is in it.
func TestRemoveTree(t *testing.T) {
	a := newTest(t, 16, 64<<20)
	b, err := New(parent+"/other", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Remove() })
	for _, d := range a.dirs {
		if _, err := os.Stat(d); err == nil {
			if err := os.MkdirAll(filepath.Join(d, "child", "grandchild"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	a.RemoveParent()
	for _, d := range a.dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s left after Remove", d)
		}
	}
	kept := false
	for _, d := range b.dirs {
		if _, err := os.Stat(filepath.Dir(d)); err == nil {
			kept = true
		}
	}
	if !kept {
		t.Error("RemoveParent removed a parent that holds another cgroup")
	}
	if err := b.Remove(); err != nil {
		t.Fatal(err)
	}
	b.RemoveParent()
	for _, d := range b.dirs {
		if _, err := os.Stat(filepath.Dir(d)); err == nil {
			t.Errorf("empty parent %s left after RemoveParent", filepath.Dir(d))
		}
	}
}

// TestRemoveEmpty: RemoveEmpty removes a parent cgroup in every hierarchy
// where it is empty, keeps it where a cgroup is in it, and finds a parent
// that is not there no error.
func TestRemoveEmpty(t *testing.T) {
	a := newTest(t, 16, 64<<20)
	var made []string
	for _, d := range a.dirs {
		if exists(d) {
			made = append(made, d)
		}
	}
	if len(made) == 0 {
		t.Fatal("the test cgroup is in no hierarchy")
	}
	if err := RemoveEmpty(parent); err != nil {
		t.Fatalf("a parent in use: %v", err)
	}
	for _, d := range made {
		if !exists(d) {
			t.Errorf("%s gone with its parent", d)
		}
	}
	if err := a.Remove(); err != nil {
		t.Fatal(err)
	}
	if err := RemoveEmpty(parent); err != nil {
		t.Fatal(err)
	}
	for _, d := range a.dirs {
		if exists(filepath.Dir(d)) {
			t.Errorf("empty parent %s left", filepath.Dir(d))
		}
	}
	if err := RemoveEmpty(parent); err != nil {
		t.Errorf("a parent gone: %v", err)
	}
}

// TestGone: a handle on a cgroup that does not exist kills, removes and
// reads nothing, without error.
func TestGone(t *testing.T) {
	cg, err := Open(parent + "/never-made")
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Kill(); err != nil {
		t.Error(err)
	}
	if err := cg.Remove(); err != nil {
		t.Error(err)
	}
	if u := cg.Usage(); u != (Usage{}) {
		t.Errorf("usage of a missing cgroup %+v; want zero", u)
	}
}

func TestOpenRefusesBadPaths(t *testing.T) {
	for _, p := range []string{"", "/", "agentrun/x", "/agentrun/../x", "/agentrun/x/"} {
		if _, err := Open(p); err == nil {
			t.Errorf("Open(%q) = nil error", p)
		}
		if _, err := New(p, nil); err == nil {
			t.Errorf("New(%q) = nil error", p)
		}
	}
}

// TestFreezeBounded: a freeze the kernel never completes (a task that
// cannot be frozen) holds the kill for freezeWait at most.
func TestFreezeBounded(t *testing.T) {
	dir := t.TempDir()
	// As on v2: the freeze file, and the events file that says whether
	// the tree is frozen; here it never is.
	os.WriteFile(filepath.Join(dir, "cgroup.freeze"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644)
	start := time.Now()
	if !freeze(dir, "cgroup.freeze", "1", "cgroup.events", "frozen 1", freezeWait) {
		t.Fatal("freeze reported not asked for")
	}
	if d := time.Since(start); d < freezeWait || d > freezeWait+time.Second {
		t.Errorf("freeze waited %v; want about %v", d, freezeWait)
	}
	os.WriteFile(filepath.Join(dir, "cgroup.events"), []byte("populated 1\nfrozen 1\n"), 0o644)
	start = time.Now()
	freeze(dir, "cgroup.freeze", "1", "cgroup.events", "frozen 1", freezeWait)
	if d := time.Since(start); d >= freezeWait {
		t.Errorf("freeze of a frozen tree waited %v", d)
	}
	if freeze(filepath.Join(dir, "gone"), "cgroup.freeze", "1", "cgroup.events", "frozen 1", freezeWait) {
		t.Error("freeze of a missing cgroup reported asked for")
	}
}

// BenchmarkUsage is the read of a run's usage at its end, on the run path.
func BenchmarkUsage(b *testing.B) {
	cg, err := New(parent+"/bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { cg.Remove(); cg.RemoveParent() }()
	for b.Loop() {
		cg.Usage()
	}
}

// BenchmarkOpenRemove is a libcontainer run's handle and the removal of
// what libcontainer's Destroy left of its cgroup (nothing, normally).
func BenchmarkOpenRemove(b *testing.B) {
	for b.Loop() {
		cg, err := Open(parent + "/gone")
		if err != nil {
			b.Fatal(err)
		}
		if err := cg.Remove(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReadFile: readFile reads a file whole up to fileMax bytes and cuts
// the rest; writeFile writes, and both name the path they fail on.
func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(strings.Repeat("x", 3*fileMax)), 0o644)
	if b, err := readFile(big); err != nil || len(b) != fileMax {
		t.Errorf("readFile of %d bytes: %d bytes, %v; want %d", 3*fileMax, len(b), err, fileMax)
	}
	if err := writeFile(big, "12\n"); err != nil {
		t.Fatal(err)
	}
	if b, err := readFile(big); err != nil || string(b) != "12\n"+strings.Repeat("x", fileMax-3) {
		t.Errorf("readFile after writeFile: %q…, %v", b[:8], err)
	}
	missing := filepath.Join(dir, "missing")
	if _, err := readFile(missing); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("readFile of a missing file: %v; want not-exist naming it", err)
	}
	if err := writeFile(missing, "1"); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("writeFile of a missing file: %v; want not-exist naming it", err)
	}
}

// TestReadKey: the "key value" files of v2 (cpu.stat, memory.events) and
// v1's memory.oom_control are read by key; what is missing reads 0.
func TestReadKey(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.peak"), []byte("268435456\n"), 0o644)
	for _, c := range []struct {
		key  string
		want uint64
	}{{"oom_kill", 2}, {"oom", 3}, {"max", 12}, {"usage_usec", 0}} {
		if got := readKey(dir, "memory.events", c.key); got != c.want {
			t.Errorf("readKey(%s) = %d; want %d", c.key, got, c.want)
		}
	}
	if got := readKey(dir, "cpu.stat", "usage_usec"); got != 0 {
		t.Errorf("readKey of a missing file = %d; want 0", got)
	}
	if got := readUint(dir, "memory.peak"); got != 256<<20 {
		t.Errorf("readUint(memory.peak) = %d; want %d", got, 256<<20)
	}
	if got := readUint(dir, "memory.swap.peak"); got != 0 {
		t.Errorf("readUint of a missing file = %d; want 0", got)
	}
}

// TestOpenFindsHierarchies: a handle names the cgroup in every mounted
// hierarchy, the v1 freezer, memory and cpuacct ones among them, the same
// each time (the hierarchies are read once).
func TestOpenFindsHierarchies(t *testing.T) {
	a, err := Open(parent + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(parent + "/y")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.dirs) == 0 || len(a.dirs) != len(b.dirs) {
		t.Fatalf("dirs %v and %v", a.dirs, b.dirs)
	}
	for i := range a.dirs {
		if filepath.Dir(a.dirs[i]) != filepath.Dir(b.dirs[i]) {
			t.Errorf("dirs %v and %v differ in more than the name", a.dirs, b.dirs)
		}
	}
	if !Unified() {
		for name, d := range map[string]string{"freezer": a.freezer, "memory": a.memory, "cpuacct": a.cpuacct} {
			if !strings.HasSuffix(d, parent+"/x") {
				t.Errorf("%s dir %q; want the cgroup in the %s hierarchy", name, d, name)
			}
		}
	}
}
