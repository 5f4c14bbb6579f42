package spec

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// DeniedSyscalls are allowed by Docker's default profile but refused in a
// sandbox: an agent's code needs no debugger, no way to read or write
// another process's memory, and no 16-bit segments (modify_ldt, kernel
// attack surface that only old and emulated binaries use).
var DeniedSyscalls = []string{
	"ptrace",
	"process_vm_readv",
	"process_vm_writev",
	"modify_ldt",
}

// namespaceSyscalls reach a new or another namespace. Docker's profile allows
// them only with CAP_SYS_ADMIN, which a sandbox never has; checkSeccomp
// proves that no rule of the composed filter allows them unconditionally.
var namespaceSyscalls = []string{"unshare", "setns", "mount", "umount2", "pivot_root", "fsopen", "open_tree", "move_mount"}

// defaultSeccomp is Docker's default profile as it applies to a process with
// no capabilities, minus DeniedSyscalls, with the kernel surface's own
// rules for socket, socketpair, ioctl and setsockopt (surfaceRules) instead
// of Docker's. It is computed once per process.
var defaultSeccomp = sync.OnceValues(func() (*specs.LinuxSeccomp, error) {
	// The profile's conditional rules depend on the bounding set: evaluate
	// them against the sandbox's (empty) one.
	noCaps := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	prof, err := seccomp.GetDefaultProfile(noCaps)
	if err != nil {
		return nil, fmt.Errorf("loading docker's default seccomp profile: %w", err)
	}
	surface := surfaceRules()
	rules := make([]specs.LinuxSyscall, 0, len(prof.Syscalls)+len(surface))
	for _, r := range prof.Syscalls {
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool {
			return (r.Action == specs.ActAllow && slices.Contains(DeniedSyscalls, n)) || slices.Contains(surfaceSyscalls, n)
		})
		if len(r.Names) == 0 {
			continue
		}
		rules = append(rules, r)
	}
	prof.Syscalls = append(rules, surface...)
	// Only the native ABI: a sandbox runs no 32-bit or x32 binaries, and a
	// syscall through another ABI then meets the filter's bad-arch action
	// (the thread is killed) instead of a second copy of every rule. The
	// filter compiles in a third of the time.
	if len(prof.Architectures) > 1 {
		prof.Architectures = prof.Architectures[:1]
	}
	if err := checkSeccomp(prof); err != nil {
		return nil, err
	}
	return prof, nil
})

// WarmSeccomp computes the sandbox's filter profile (once per process,
// WithSeccomp's), so that a caller can have it made beside other work: a
// cold run's set-up otherwise waited for it (Docker's profile evaluated
// and rewritten, about 0.3 ms).
func WarmSeccomp() { _, _ = defaultSeccomp() }

// checkSeccomp refuses a filter that allows any syscall by default, that
// allows a denied or namespace syscall without argument conditions or
// clone3 at all, or that
// has an unconditional rule for a kernel-surface syscall (which would wipe
// its conditional rules in libseccomp).
func checkSeccomp(p *specs.LinuxSeccomp) error {
	if p.DefaultAction == specs.ActAllow || p.DefaultAction == specs.ActLog {
		return fmt.Errorf("seccomp default action %q allows unknown syscalls", p.DefaultAction)
	}
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			if slices.Contains(surfaceSyscalls, n) && len(r.Args) == 0 {
				return fmt.Errorf("seccomp has an unconditional rule for %s, which overrides its argument rules", n)
			}
		}
		if r.Action != specs.ActAllow && r.Action != specs.ActLog {
			continue
		}
		for _, n := range r.Names {
			if slices.Contains(DeniedSyscalls, n) {
				return fmt.Errorf("seccomp allows denied syscall %s", n)
			}
			if slices.Contains(namespaceSyscalls, n) && len(r.Args) == 0 {
				return fmt.Errorf("seccomp allows namespace syscall %s", n)
			}
			if n == "clone3" {
				// Its flags are in memory: no argument rule can
				// tell a thread from a new namespace.
				return errors.New("seccomp allows clone3, whose namespace flags no filter can read")
			}
		}
	}
	return nil
}

// WithSeccomp installs the sandbox's seccomp filter: Docker's default profile
// for a process without capabilities, with DeniedSyscalls removed and the
// kernel surface's allowlist (surface.go).
func WithSeccomp() SpecOpt {
	return func(s *specs.Spec) error {
		p, err := defaultSeccomp()
		if err != nil {
			return err
		}
		// The cached profile is shared: give each spec its own copy of the
		// top-level struct; rules are never modified after creation.
		cp := *p
		s.Linux.Seccomp = &cp
		return nil
	}
}
