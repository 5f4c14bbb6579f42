package runsc

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/runtime/spec"
)

// CgroupParent holds the cgroups of runsc runs, apart from libcontainer's,
// unless the backend names another (New).
const CgroupParent = "/agentrun-runsc"

// clone3Rule refuses clone3 with ENOSYS under gVisor: SCMP_ACT_TRACE with no
// tracer (gVisor's pkg/sentry/kernel/seccomp.go answers it ENOSYS, as
// Linux's seccomp(2) documents), where an errno rule would read EPERM.
var clone3Rule = specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActTrace}

// SpecOpt adapts a sandbox spec to gVisor; apply it after the limits and
// the seccomp filter:
//
//   - the host pids limit covers gVisor's own tasks too (about 22 at rest,
//     about 2 per program process, more while the sentry is busy), and the
//     sentry panics when it cannot make a thread; so the host cgroup gets
//     4n+128, which still stops a runaway sandbox, and the program is held
//     to n by RLIMIT_NPROC inside gVisor's kernel (fork fails with EAGAIN,
//     as under Linux);
//   - gVisor answers every errno rule of a seccomp filter with EPERM, so
//     Docker's "clone3 gives ENOSYS" rule would stop glibc from falling back
//     to clone and no thread could start. clone3 gets a trace rule instead
//     (clone3Rule), which gVisor answers ENOSYS, as Linux does, when no
//     tracer is attached, and none can be: ptrace is refused in the
//     sandbox. So clone3, whose flags are in memory where no filter can
//     read them, is refused on both runtimes, and glibc falls back to clone,
//     whose namespace flags Docker's rule refuses (allowed, clone3 made a
//     user and network namespace in gVisor's kernel with every capability
//     there and a raw socket);
//   - the sandbox's socket sysctls are dropped: its sockets are gVisor's
//     netstack, whose buffers are the sentry's memory, inside the run's
//     cgroup, not host sockets.
func SpecOpt() spec.SpecOpt {
	return func(s *specs.Spec) error {
		delete(s.Linux.Sysctl, "net.ipv4.tcp_rmem")
		delete(s.Linux.Sysctl, "net.ipv4.tcp_wmem")
		if r := s.Linux.Resources; r != nil && r.Pids != nil && r.Pids.Limit != nil {
			// Inside, gVisor's own kernel holds the program to the limit
			// (RLIMIT_NPROC there counts only the sandbox's processes).
			limit := uint64(*r.Pids.Limit)
			s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Soft: limit, Hard: limit})
			n := 4**r.Pids.Limit + 128
			r.Pids = &specs.LinuxPids{Limit: &n}
		}
		if sc := s.Linux.Seccomp; sc != nil {
			cp := *sc
			cp.Syscalls = nil
			for _, r := range sc.Syscalls {
				if slices.Contains(r.Names, "clone3") {
					r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return n == "clone3" })
					if len(r.Names) == 0 {
						continue
					}
				}
				cp.Syscalls = append(cp.Syscalls, r)
			}
			cp.Syscalls = append(cp.Syscalls, clone3Rule)
			s.Linux.Seccomp = &cp
		}
		return nil
	}
}
