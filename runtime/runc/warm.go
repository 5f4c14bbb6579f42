package runc

import (
	"os"
	"path/filepath"

	"github.com/opencontainers/cgroups"
)

// WarmCgroupLock makes the kernel's cgroup migration lock ready for the
// next container start, in the background.
//
// Moving a process into a cgroup (libcontainer does it for every container
// init, before the init may go on) takes the kernel's global
// cgroup_threadgroup_rwsem for writing, and the first writer after a quiet
// spell waits a full RCU grace period: 5 to 15 ms, during which nothing else
// in the start can proceed. Writers for a grace period after that are
// fast. WarmCgroupLock moves this process into the cgroup it is already in
// (a no-op for the process, but a writer for the lock), so that the wait
// overlaps with the rest of a run's set-up instead of adding to it.
//
// It returns at once. Errors are ignored: it is only an optimisation.
func WarmCgroupLock() {
	go func() {
		if p := ownProcsFile(); p != "" {
			_ = os.WriteFile(p, []byte("0"), 0)
		}
	}()
}

// ownProcsFile is the cgroup.procs file of this process's own cgroup in one
// hierarchy: the unified one, or pids on cgroup v1.
func ownProcsFile() string {
	own, err := cgroups.ParseCgroupFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	if cgroups.IsCgroup2UnifiedMode() {
		return filepath.Join("/sys/fs/cgroup", own[""], "cgroup.procs")
	}
	if p, ok := own["pids"]; ok {
		return filepath.Join("/sys/fs/cgroup/pids", p, "cgroup.procs")
	}
	return ""
}
