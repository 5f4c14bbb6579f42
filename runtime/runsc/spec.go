package runsc

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/runtime/spec"
)

// CgroupParent holds the cgroups of runsc runs, apart from libcontainer's,
// unless the backend names another (New).
const CgroupParent = "/agentrun-runsc"

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
//     to clone and no thread could start: clone3 is allowed instead. Any
//     namespace a program makes with it lives in gVisor's kernel, not the
//     host's, and gVisor's own filter still guards the host;
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
				if slices.Contains(r.Names, "clone3") && r.Action != specs.ActAllow {
					r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return n == "clone3" })
					if len(r.Names) == 0 {
						continue
					}
				}
				cp.Syscalls = append(cp.Syscalls, r)
			}
			cp.Syscalls = append(cp.Syscalls, specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow})
			s.Linux.Seccomp = &cp
		}
		return nil
	}
}
