package runsc

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
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// unifiedRoot is where a pure cgroup v2 host mounts its hierarchy.
const unifiedRoot = "/sys/fs/cgroup"

// sandboxCgroup is the cgroup agentrun creates for one run. runsc finds it
// already there and uses it as is: it neither changes its limits nor
// removes it, so agentrun reads its usage after the sandbox is gone.
type sandboxCgroup struct {
	path string // e.g. /agentrun-runsc/ar-1234, relative to each hierarchy
	v1   cgroup1.Cgroup
	v2   *cgroup2.Manager
	// dirs are the cgroup's directories, one per v1 hierarchy or the single
	// v2 one.
	dirs []string
	// oomFD is the v1 OOM notification eventfd, -1 when there is none.
	oomFD int
}

// newCgroup creates the cgroup at path with the spec's memory (swap = memory),
// cpu and pids limits, on a v1/hybrid host with cgroup v1, on a unified host
// with cgroup v2.
func newCgroup(path string, res *specs.LinuxResources) (*sandboxCgroup, error) {
	limits := &specs.LinuxResources{}
	if res != nil {
		limits.Memory, limits.CPU, limits.Pids = res.Memory, res.CPU, res.Pids
	}
	cg := &sandboxCgroup{path: path, oomFD: -1}
	var err error
	// A concurrent run may remove the shared, momentarily empty parent
	// between our mkdir of it and of path: try again once.
	for range 2 {
		if cgroups.Mode() == cgroups.Unified {
			err = cg.create2(limits)
		} else {
			err = cg.create1(limits)
		}
		if !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err != nil {
		_ = cg.remove()
		return nil, fmt.Errorf("creating cgroup %s: %w", path, err)
	}
	return cg, nil
}

func (cg *sandboxCgroup) create1(limits *specs.LinuxResources) error {
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
	cg.dirs = v1Dirs(cg.path)
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

func (cg *sandboxCgroup) create2(limits *specs.LinuxResources) error {
	cg.dirs = []string{filepath.Join(unifiedRoot, cg.path)}
	m, err := cgroup2.NewManager(unifiedRoot, cg.path, cgroup2.ToResources(limits))
	if err != nil {
		return err
	}
	cg.v2 = m
	return nil
}

// v1Dirs lists path in every mounted v1 hierarchy (cpu and cpuacct, which
// share one, appear once).
func v1Dirs(path string) []string {
	subs, err := cgroup1.Default()
	if err != nil {
		return nil
	}
	var dirs []string
	for _, s := range subs {
		p, ok := s.(interface{ Path(string) string })
		if !ok {
			continue
		}
		root := p.Path("/")
		if real, err := filepath.EvalSymlinks(root); err == nil {
			root = real
		}
		d := filepath.Join(root, path)
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// usage reads cpu time and peak memory of everything that ran in the cgroup.
func (cg *sandboxCgroup) usage() (cpu time.Duration, peak int64) {
	switch {
	case cg.v1 != nil:
		st, err := cg.v1.Stat(cgroup1.IgnoreNotExist)
		if err != nil {
			return 0, 0
		}
		if st.CPU != nil && st.CPU.Usage != nil {
			cpu = time.Duration(st.CPU.Usage.Total)
		}
		if st.Memory != nil && st.Memory.Usage != nil {
			peak = int64(st.Memory.Usage.Max)
		}
	case cg.v2 != nil:
		st, err := cg.v2.Stat()
		if err != nil {
			return 0, 0
		}
		if st.CPU != nil {
			cpu = time.Duration(st.CPU.UsageUsec) * time.Microsecond
		}
		if st.Memory != nil {
			peak = int64(st.Memory.MaxUsage)
		}
	}
	return cpu, peak
}

// oomKilled reports whether the kernel's OOM killer ended a process of the
// sandbox because the cgroup reached its memory limit.
func (cg *sandboxCgroup) oomKilled() bool {
	switch {
	case cg.v1 != nil:
		// The eventfd fires when the cgroup hit its limit and went OOM; the
		// oom_kill counter (per cgroup, not hierarchical) counts the kills of
		// processes in it, which are all of the sandbox's.
		if cg.oomFD >= 0 {
			fds := []unix.PollFd{{Fd: int32(cg.oomFD), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
				return true
			}
		}
		st, err := cg.v1.Stat(cgroup1.IgnoreNotExist)
		return err == nil && st.MemoryOomControl != nil && st.MemoryOomControl.OomKill > 0
	case cg.v2 != nil:
		st, err := cg.v2.Stat()
		return err == nil && st.MemoryEvents != nil && st.MemoryEvents.OomKill > 0
	}
	return false
}

// pids lists the processes left anywhere in the cgroup's tree.
func (cg *sandboxCgroup) pids() []int {
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

// kill SIGKILLs every process in the cgroup's tree and waits, up to a few
// seconds, until the tree is empty.
func (cg *sandboxCgroup) kill() error {
	if len(cg.pids()) == 0 {
		return nil
	}
	switch {
	case cg.v2 != nil:
		_ = cg.v2.Kill() // cgroup.kill, recursive
	case cg.v1 != nil:
		// Frozen, no process can fork a child that the listing misses.
		frozen := cg.v1.Freeze() == nil
		for _, pid := range cg.pids() {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if frozen {
			_ = cg.v1.Thaw()
		}
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		left := cg.pids()
		if len(left) == 0 {
			return nil
		}
		for _, pid := range left {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	return fmt.Errorf("cgroup %s: processes %v survived SIGKILL", cg.path, cg.pids())
}

// remove deletes the cgroup and any child cgroups left in it, in every
// hierarchy. It retries briefly while the kernel still counts a dying task.
func (cg *sandboxCgroup) remove() error {
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
		// Children first.
		for i := len(tree) - 1; i >= 0; i-- {
			if err := rmdir(tree[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeParent removes the cgroup's parent (e.g. /agentrun-runsc) in every
// hierarchy when it is empty; it stays while another run uses it.
func (cg *sandboxCgroup) removeParent() {
	if filepath.Dir(cg.path) == "/" {
		return
	}
	for _, d := range cg.dirs {
		_ = unix.Rmdir(filepath.Dir(d))
	}
}

func rmdir(dir string) error {
	var err error
	for i := 0; i < 50; i++ {
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
