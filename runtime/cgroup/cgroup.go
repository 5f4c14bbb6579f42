package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// unifiedRoot is where a v2 host mounts its one hierarchy, and where a v1
// host mounts the directory of its hierarchies.
const unifiedRoot = "/sys/fs/cgroup"

// Unified reports whether the host has cgroup v2 only.
func Unified() bool { return cgroups.IsCgroup2UnifiedMode() }

// Cgroup is one run's cgroup. Its methods are not safe for concurrent use.
type Cgroup struct {
	path string // e.g. /agentrun-runsc/ar-1234, the same in every hierarchy
	// dirs are the cgroup's directory in each hierarchy (the one v2 one).
	dirs []string
	// freezer, memory and cpuacct are the cgroup's directory in these v1
	// hierarchies ("" on v2, or where the hierarchy is not mounted).
	freezer, memory, cpuacct string
	// oomFD is the v1 OOM notification eventfd, -1 when there is none.
	oomFD int
	// cpuBase is the cpu time used before Start; peakFD, -1 when there is
	// none, is v2's memory.peak opened and reset at Start.
	cpuBase time.Duration
	peakFD  int
}

// Open returns the cgroup at path (absolute and clean, not the root),
// made by someone else: libcontainer, or an agentrun that died. It need
// not exist, in any or all hierarchies.
func Open(path string) (*Cgroup, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || path == "/" {
		return nil, fmt.Errorf("cgroup path %q must be absolute and clean, and not the root", path)
	}
	cg := &Cgroup{path: path, oomFD: -1, peakFD: -1}
	if Unified() {
		cg.dirs = []string{filepath.Join(unifiedRoot, path)}
		return cg, nil
	}
	mounts, err := hierarchies()
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		d := filepath.Join(m.Mountpoint, path)
		if !slices.Contains(cg.dirs, d) {
			cg.dirs = append(cg.dirs, d)
		}
		if m.FSType != "cgroup" {
			continue
		}
		opts := strings.Split(m.VFSOptions, ",")
		for name, dir := range map[string]*string{"freezer": &cg.freezer, "memory": &cg.memory, "cpuacct": &cg.cpuacct} {
			if slices.Contains(opts, name) {
				*dir = d
			}
		}
	}
	return cg, nil
}

var (
	mountsMu sync.Mutex
	mounts   []*mountinfo.Info
)

// hierarchies lists the mounted cgroup hierarchies, read once (as
// libcontainer reads its cgroup root once).
func hierarchies() ([]*mountinfo.Info, error) {
	mountsMu.Lock()
	defer mountsMu.Unlock()
	if mounts == nil {
		m, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup", "cgroup2"))
		if err != nil {
			return nil, fmt.Errorf("listing cgroup hierarchies: %w", err)
		}
		mounts = m
	}
	return mounts, nil
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
	res := resources(limits)
	m, err := fs.NewManager(&cgroups.Cgroup{Path: cg.path, Resources: res}, nil)
	if err != nil {
		return err
	}
	if err := apply(m, res); err != nil {
		return err
	}
	fd, err := oomEventFD(cg.memory)
	if err != nil {
		return fmt.Errorf("registering oom notification: %w", err)
	}
	cg.oomFD = fd
	return nil
}

func (cg *Cgroup) create2(limits *specs.LinuxResources) error {
	res := resources(limits)
	m, err := fs2.NewManager(&cgroups.Cgroup{Path: cg.path, Resources: res}, cg.dirs[0])
	if err != nil {
		return err
	}
	return apply(m, res)
}

// apply makes m's cgroup, joining no process to it, and sets res in it.
func apply(m cgroups.Manager, res *cgroups.Resources) error {
	if err := m.Apply(-1); err != nil {
		return err
	}
	return m.Set(res)
}

// resources is limits' memory, swap, cpu and pids limits in the terms of
// the cgroup library (opencontainers/cgroups, libcontainer's). Device
// rules are left alone, as the backend's own are.
func resources(limits *specs.LinuxResources) *cgroups.Resources {
	res := &cgroups.Resources{SkipDevices: true}
	if m := limits.Memory; m != nil {
		if m.Limit != nil {
			res.Memory = *m.Limit
		}
		if m.Swap != nil {
			res.MemorySwap = *m.Swap
		}
	}
	if c := limits.CPU; c != nil {
		if c.Quota != nil {
			res.CpuQuota = *c.Quota
		}
		if c.Period != nil {
			res.CpuPeriod = *c.Period
		}
		if c.Shares != nil {
			res.CpuShares = *c.Shares
		}
	}
	if p := limits.Pids; p != nil {
		res.PidsLimit = p.Limit
	}
	return res
}

// oomEventFD registers an eventfd with the v1 memory cgroup at dir that
// the kernel signals when the cgroup goes out of memory (cgroup v1's
// memory.oom_control notification); -1 when there is no memory
// hierarchy.
func oomEventFD(dir string) (int, error) {
	if dir == "" {
		return -1, nil
	}
	ctl, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return -1, err
	}
	defer ctl.Close()
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return -1, os.NewSyscallError("eventfd", err)
	}
	reg := fmt.Sprintf("%d %d", efd, ctl.Fd())
	if err := writeFile(filepath.Join(dir, "cgroup.event_control"), reg); err != nil {
		unix.Close(efd)
		return -1, err
	}
	return efd, nil
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
func (cg *Cgroup) Kill() error { return cg.KillSeen(nil) }

// KillSeen is Kill, calling seen, if not nil, with the processes in the
// tree before each kill, while the tree is frozen: none of them can fork
// or have exited unseen in between (but for a task the freeze could not
// stop in time). A caller that must reap what the kill leaves learns the
// processes there, and their children (/proc/PID/task/TID/children, zombies
// included), from it.
func (cg *Cgroup) KillSeen(seen func(pids []int)) error {
	if len(cg.Pids()) == 0 {
		return nil
	}
	for deadline := time.Now().Add(killWait); time.Now().Before(deadline); {
		cg.killOnce(seen)
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
// the tree frozen. With seen, the tree is frozen on v2 too, and seen gets
// the listing.
func (cg *Cgroup) killOnce(seen func(pids []int)) {
	dir, file, value, stateFile, want, thaw := cg.freezer, "freezer.state", "FROZEN", "freezer.state", "FROZEN", "THAWED"
	if Unified() {
		dir, file, value, stateFile, want, thaw = cg.dirs[0], "cgroup.freeze", "1", "cgroup.events", "frozen 1", "0"
		// cgroup.kill where the kernel has it; else the bounded freeze
		// below, the listing and the kill.
		if seen == nil && writeFile(filepath.Join(dir, "cgroup.kill"), "1") == nil {
			return
		}
	}
	// A listing for seen must be whole: the freeze may take up to
	// killWait for that.
	wait := freezeWait
	if seen != nil {
		wait = killWait
	}
	frozen := dir != "" && freeze(dir, file, value, stateFile, want, wait)
	pids := cg.Pids()
	if seen != nil {
		seen(pids)
	}
	if !Unified() || writeFile(filepath.Join(dir, "cgroup.kill"), "1") != nil {
		killAll(pids)
	}
	if frozen {
		_ = writeFile(filepath.Join(dir, file), thaw)
	}
}

// freezeWait bounds a freeze: a task that cannot be frozen (one in an
// uninterruptible sleep) must not hold the kill. opencontainers/cgroups'
// freeze retries a thousand times, for up to 10 s on v2.
const freezeWait = 200 * time.Millisecond

// freeze writes value to dir's file and waits, up to wait, until dir's
// stateFile holds want (a line of it, on v2). It reports whether the
// freeze was asked for: the caller thaws then, frozen in time or not.
func freeze(dir, file, value, stateFile, want string, wait time.Duration) bool {
	if writeFile(filepath.Join(dir, file), value) != nil {
		return false
	}
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := readFile(filepath.Join(dir, stateFile))
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

// Start marks the start of the program: from then on Usage reports the
// cpu time used since, and the peak memory since (the memory in use at
// Start, the waiting init's, is its floor), not what the sandbox's set-up
// used before (a container's init takes tens of milliseconds of cpu,
// longer before a pooled sandbox's program than the program itself). On
// v2 the peak is reset through a memory.peak descriptor of its own, which
// kernels before 6.12 cannot: there the peak stays the cgroup's whole.
func (cg *Cgroup) Start() {
	cg.cpuBase = cg.cpu()
	if !Unified() {
		if cg.memory != "" {
			// Writing 0 sets a v1 maximum to the current usage.
			for _, f := range []string{"memory.max_usage_in_bytes", "memory.kmem.tcp.max_usage_in_bytes"} {
				_ = writeFile(filepath.Join(cg.memory, f), "0")
			}
		}
		return
	}
	if cg.peakFD >= 0 {
		unix.Close(cg.peakFD)
	}
	cg.peakFD = -1
	fd, err := unix.Open(filepath.Join(cg.dirs[0], "memory.peak"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	if _, err := unix.Write(fd, []byte("reset\n")); err != nil {
		unix.Close(fd)
		return
	}
	cg.peakFD = fd
}

// cpu is the cpu time the cgroup has used; 0 if it cannot be read.
func (cg *Cgroup) cpu() time.Duration {
	if Unified() {
		return time.Duration(readKey(cg.dirs[0], "cpu.stat", "usage_usec")) * time.Microsecond
	}
	if cg.cpuacct == "" {
		return 0
	}
	return time.Duration(readUint(cg.cpuacct, "cpuacct.usage"))
}

// Usage reads the cgroup's cpu time, peak memory and OOM kills, since
// Start if it was called; zero if the cgroup is gone. It reads the few
// files these are in, not the library's statistics of the controllers,
// which read memory.stat and a dozen files more, and took twice as long
// (BenchmarkUsage).
func (cg *Cgroup) Usage() Usage {
	u := Usage{CPU: max(0, cg.cpu()-cg.cpuBase)}
	if Unified() {
		dir := cg.dirs[0]
		if cg.peakFD >= 0 {
			u.MemoryPeak = int64(preadUint(cg.peakFD))
		} else {
			u.MemoryPeak = int64(readUint(dir, "memory.peak"))
		}
		u.OOMKilled = readKey(dir, "memory.events", "oom_kill") > 0
		return u
	}
	// The eventfd fires when the cgroup hit its limit and went OOM.
	if cg.oomFD >= 0 {
		fds := []unix.PollFd{{Fd: int32(cg.oomFD), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			u.OOMKilled = true
		}
	}
	if cg.memory != "" {
		u.MemoryPeak = int64(readUint(cg.memory, "memory.max_usage_in_bytes") +
			readUint(cg.memory, "memory.kmem.tcp.max_usage_in_bytes"))
		// oom_kill counts the processes of this cgroup the OOM killer ended.
		if readKey(cg.memory, "memory.oom_control", "oom_kill") > 0 {
			u.OOMKilled = true
		}
	}
	return u
}

// fileMax bounds what readFile reads: the files it reads (usage, freezer
// state) are a line or a few dozen. cgroup.procs, a line per process, is
// read whole.
const fileMax = 4096

// readFile reads a cgroup file of at most fileMax bytes (the rest is
// cut). It makes the system calls itself: os.ReadFile registers a cgroup
// file, which can be polled, with the runtime's poller and takes it off
// again, three times the calls for a read that never blocks, and the
// usage reads are on a run's path to its answer.
func readFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b := make([]byte, fileMax)
	n := 0
	for n < len(b) {
		m, err := unix.Read(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return b[:n], nil
}

// writeFile writes value to an existing cgroup file in one write, as
// readFile reads: without the runtime's poller.
func writeFile(path, value string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value)); err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// readUint reads a file of one number; 0 if it cannot.
func readUint(dir, file string) uint64 {
	b, err := readFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	return parseUint(b)
}

// parseUint is the number b holds, surrounded by white space; 0 if none.
func parseUint(b []byte) uint64 {
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// preadUint reads the number in the file open at fd, from its start; 0
// if it cannot.
func preadUint(fd int) uint64 {
	var b [32]byte
	n, err := unix.Pread(fd, b[:], 0)
	if err != nil || n <= 0 {
		return 0
	}
	return parseUint(b[:n])
}

// readKey reads the number of key in a file of "key value" lines; 0 if it
// cannot.
func readKey(dir, file, key string) uint64 {
	b, err := readFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == key {
			n, _ := strconv.ParseUint(v, 10, 64)
			return n
		}
	}
	return 0
}

// Remove deletes the cgroup and any child cgroups in it, in every
// hierarchy, children first. It retries briefly while the kernel still
// counts a dying task. The processes must be gone (Kill). A cgroup gone
// already is not an error.
func (cg *Cgroup) Remove() error {
	if cg.peakFD >= 0 {
		unix.Close(cg.peakFD)
		cg.peakFD = -1
	}
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

// RemoveParent removes the cgroup's parent (the tool servers', e.g.
// /agentrun-tools) in every hierarchy where it is empty; it stays where
// another cgroup is in it. The caller holds the parent's cgroup-parent
// lock exclusively (internal/state), so that no cgroup is being made in
// it meanwhile.
func (cg *Cgroup) RemoveParent() {
	if parent := filepath.Dir(cg.path); parent != "/" {
		_ = RemoveEmpty(parent) // a parent in use stays
	}
}

// RemoveEmpty removes the cgroup at path (a backend's shared parent, say)
// in every hierarchy where it is there and empty; where a cgroup is still
// in it, it stays. The caller holds what keeps others from making a
// cgroup in it meanwhile (the backend's cgroup-parent lock, exclusively:
// internal/state).
func RemoveEmpty(path string) error {
	cg, err := Open(path)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range cg.dirs {
		err := unix.Rmdir(d)
		if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
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
