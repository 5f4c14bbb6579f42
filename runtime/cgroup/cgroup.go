package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// unifiedRoot is where a v2 host mounts its one hierarchy, and where a v1
// host mounts the directory of its hierarchies.
const unifiedRoot = "/sys/fs/cgroup"

// Unified reports whether the host has cgroup v2 only.
func Unified() bool { return cgroups.Mode() == cgroups.Unified }

// Cgroup is one run's cgroup. Its methods are not safe for concurrent use.
type Cgroup struct {
	path string // e.g. /agentrun-runsc/ar-1234, the same in every hierarchy
	// dirs are the cgroup's directory in each hierarchy (the one v2 one).
	dirs []string
	// freezer is the v1 freezer hierarchy's directory ("" on v2).
	freezer string
	// v1 is set by New on a v1 host, for the OOM notification.
	v1 cgroup1.Cgroup
	// oomFD is the v1 OOM notification eventfd, -1 when there is none.
	oomFD int
}

// Open returns the cgroup at path (absolute and clean, not the root),
// made by someone else: libcontainer, or an agentrun that died. It need
// not exist, in any or all hierarchies.
func Open(path string) (*Cgroup, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return nil, fmt.Errorf("cgroup path %q must be absolute and clean, and not the root", path)
	}
	cg := &Cgroup{path: path, oomFD: -1}
	if Unified() {
		cg.dirs = []string{filepath.Join(unifiedRoot, path)}
		return cg, nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
	if err != nil {
		return nil, fmt.Errorf("listing cgroup hierarchies: %w", err)
	}
	for _, m := range mounts {
		d := filepath.Join(m.Mountpoint, path)
		if !slices.Contains(cg.dirs, d) {
			cg.dirs = append(cg.dirs, d)
		}
		if m.FSType == "cgroup" && slices.Contains(strings.Split(m.VFSOptions, ","), "freezer") {
			cg.freezer = d
		}
	}
	return cg, nil
}

// New creates the cgroup at path with res's memory (swap = memory), cpu
// and pids limits; nothing else of res is applied. On error nothing of it
// is left.
func New(path string, res *specs.LinuxResources) (*Cgroup, error) {
	cg, err := Open(path)
	if err != nil {
		return nil, err
	}
	limits := &specs.LinuxResources{}
	if res != nil {
		limits.Memory, limits.CPU, limits.Pids = res.Memory, res.CPU, res.Pids
	}
	// A concurrent run may remove the shared, momentarily empty parent
	// between our mkdir of it and of path (the backend's cgroup-parent
	// lock is what prevents it): try again once.
	for range 2 {
		if Unified() {
			err = cg.create2(limits)
		} else {
			err = cg.create1(limits)
		}
		if !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err != nil {
		_ = cg.Remove()
		return nil, fmt.Errorf("creating cgroup %s: %w", path, err)
	}
	return cg, nil
}

func (cg *Cgroup) create1(limits *specs.LinuxResources) error {
	if limits.Memory != nil && limits.Memory.Swap != nil {
		// Without swap accounting there is no memsw file; the memory limit
		// alone then bounds the sandbox's RAM.
		if _, err := os.Stat(filepath.Join(unifiedRoot, "memory", "memory.memsw.limit_in_bytes")); err != nil {
			m := *limits.Memory
			m.Swap = nil
			limits.Memory = &m
		}
	}
	c, err := cgroup1.New(cgroup1.StaticPath(cg.path), limits)
	if err != nil {
		return err
	}
	cg.v1 = c
	fd, err := c.OOMEventFD()
	if err != nil {
		return fmt.Errorf("registering oom notification: %w", err)
	}
	cg.oomFD = int(fd)
	return nil
}

func (cg *Cgroup) create2(limits *specs.LinuxResources) error {
	_, err := cgroup2.NewManager(unifiedRoot, cg.path, cgroup2.ToResources(limits))
	return err
}

// Path is the cgroup's path, the same in every hierarchy.
func (cg *Cgroup) Path() string { return cg.path }

// Pids lists the processes left anywhere in the cgroup's tree.
func (cg *Cgroup) Pids() []int {
	var out []int
	for _, d := range cg.dirs {
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for f := range strings.FieldsSeq(string(b)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid > 0 && !slices.Contains(out, pid) {
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// killWait bounds how long Kill waits for the tree to empty.
const killWait = 5 * time.Second

// Kill SIGKILLs every process in the cgroup's tree and waits, up to
// killWait, until the tree is empty, killing again whatever is left. It
// returns an error naming the processes that survived.
func (cg *Cgroup) Kill() error {
	if len(cg.Pids()) == 0 {
		return nil
	}
	for deadline := time.Now().Add(killWait); time.Now().Before(deadline); {
		cg.killOnce()
		// The killed take a moment to exit; whatever is still listed
		// after that is killed again.
		for wait := time.Now().Add(100 * time.Millisecond); time.Now().Before(wait); time.Sleep(5 * time.Millisecond) {
			if len(cg.Pids()) == 0 {
				return nil
			}
		}
	}
	return fmt.Errorf("cgroup %s: processes %v survived SIGKILL", cg.path, cg.Pids())
}

// killOnce SIGKILLs every process in the tree such that none can fork a
// child the kill misses: on v2 by cgroup.kill (Linux 5.14), which kills
// the tree at once; otherwise by listing and killing the processes with
// the tree frozen.
func (cg *Cgroup) killOnce() {
	if Unified() {
		// Not cgroup2.Manager.Kill: without cgroup.kill it falls back to
		// a freeze it waits on without bound, and it reaps what it killed,
		// which may be the caller's child.
		if os.WriteFile(filepath.Join(cg.dirs[0], "cgroup.kill"), []byte("1"), 0) == nil {
			return
		}
		frozen := freeze(cg.dirs[0], "cgroup.freeze", "1", "cgroup.events", "frozen 1")
		killAll(cg.Pids())
		if frozen {
			_ = os.WriteFile(filepath.Join(cg.dirs[0], "cgroup.freeze"), []byte("0"), 0)
		}
		return
	}
	frozen := cg.freezer != "" && freeze(cg.freezer, "freezer.state", "FROZEN", "freezer.state", "FROZEN")
	killAll(cg.Pids())
	if frozen {
		_ = os.WriteFile(filepath.Join(cg.freezer, "freezer.state"), []byte("THAWED"), 0)
	}
}

// freezeWait bounds a freeze: a task that cannot be frozen (one in an
// uninterruptible sleep) must not hold the kill. The library's Freeze
// waits without bound.
const freezeWait = 200 * time.Millisecond

// freeze writes value to dir's file and waits, up to freezeWait, until
// dir's stateFile holds want (a line of it, on v2). It reports whether the
// freeze was asked for: the caller thaws then, frozen in time or not.
func freeze(dir, file, value, stateFile, want string) bool {
	if os.WriteFile(filepath.Join(dir, file), []byte(value), 0) != nil {
		return false
	}
	for deadline := time.Now().Add(freezeWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, stateFile))
		if err != nil {
			break
		}
		if slices.Contains(strings.Split(strings.TrimSpace(string(b)), "\n"), want) {
			break
		}
	}
	return true
}

func killAll(pids []int) {
	for _, pid := range pids {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// Usage is what everything that ran in a cgroup used.
type Usage struct {
	CPU time.Duration
	// MemoryPeak is the highest memory use, socket buffers included (on
	// v1 the TCP buffers' peak is added, as v1 keeps them apart); 0 on a
	// v2 kernel before 5.19, which has no memory.peak.
	MemoryPeak int64
	// OOMKilled: the kernel's OOM killer ended a process of the cgroup
	// because the cgroup reached its memory limit.
	OOMKilled bool
}

// Usage reads the cgroup's cpu time, peak memory and OOM kills; zero if
// the cgroup is gone. It reads only the cpu and memory controllers.
func (cg *Cgroup) Usage() Usage {
	var u Usage
	if Unified() {
		m, err := cgroup2.Load(cg.path)
		if err != nil {
			return u
		}
		st, err := m.StatFiltered(cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents)
		if err != nil {
			return u
		}
		if st.CPU != nil {
			u.CPU = time.Duration(st.CPU.UsageUsec) * time.Microsecond
		}
		if st.Memory != nil {
			u.MemoryPeak = int64(st.Memory.MaxUsage)
		}
		u.OOMKilled = st.MemoryEvents != nil && st.MemoryEvents.OomKill > 0
		return u
	}
	// The eventfd fires when the cgroup hit its limit and went OOM.
	if cg.oomFD >= 0 {
		fds := []unix.PollFd{{Fd: int32(cg.oomFD), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			u.OOMKilled = true
		}
	}
	c, err := cgroup1.Load(cgroup1.StaticPath(cg.path), cgroup1.WithHierarchy(usageHierarchy))
	if err != nil {
		return u
	}
	st, err := c.Stat(cgroup1.IgnoreNotExist)
	if err != nil {
		return u
	}
	if st.CPU != nil && st.CPU.Usage != nil {
		u.CPU = time.Duration(st.CPU.Usage.Total)
	}
	if st.Memory != nil && st.Memory.Usage != nil {
		u.MemoryPeak = int64(st.Memory.Usage.Max)
		if st.Memory.KernelTCP != nil {
			u.MemoryPeak += int64(st.Memory.KernelTCP.Max)
		}
	}
	// oom_kill counts the processes of this cgroup the OOM killer ended.
	if st.MemoryOomControl != nil && st.MemoryOomControl.OomKill > 0 {
		u.OOMKilled = true
	}
	return u
}

// usageHierarchy is the cpuacct and memory controllers of a v1 host. The
// memsw and kmem figures are not read: a host without swap accounting, or
// a kernel without kmem limits, lacks their files, and a missing file ends
// the memory controller's reading before the TCP figures.
func usageHierarchy() ([]cgroup1.Subsystem, error) {
	return []cgroup1.Subsystem{
		cgroup1.NewCpuacct(unifiedRoot),
		cgroup1.NewMemory(unifiedRoot, cgroup1.IgnoreModules("memsw", "kmem")),
	}, nil
}

// Remove deletes the cgroup and any child cgroups in it, in every
// hierarchy, children first. It retries briefly while the kernel still
// counts a dying task. The processes must be gone (Kill). A cgroup gone
// already is not an error.
func (cg *Cgroup) Remove() error {
	if cg.oomFD >= 0 {
		unix.Close(cg.oomFD)
		cg.oomFD = -1
	}
	var errs []error
	for _, d := range cg.dirs {
		var tree []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				tree = append(tree, p)
			}
			return nil
		})
		for i := len(tree) - 1; i >= 0; i-- {
			if err := rmdir(tree[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// RemoveParent removes the cgroup's parent (a backend's, e.g.
// /agentrun-runsc) in every hierarchy where it is empty; it stays where
// another run's cgroup is in it. The caller holds the backend's
// cgroup-parent lock exclusively (internal/state), so that no run is
// creating its cgroup in it meanwhile.
func (cg *Cgroup) RemoveParent() {
	if filepath.Dir(cg.path) == "/" {
		return
	}
	for _, d := range cg.dirs {
		_ = unix.Rmdir(filepath.Dir(d))
	}
}

func rmdir(dir string) error {
	var err error
	for range 50 {
		err = unix.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err)
}
