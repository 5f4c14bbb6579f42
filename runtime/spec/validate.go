package spec

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// requiredNamespaces must each be private to the sandbox.
var requiredNamespaces = []specs.LinuxNamespaceType{
	specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace,
	specs.UTSNamespace, specs.MountNamespace, specs.CgroupNamespace,
}

// Validate checks a composed spec against the sandbox's invariants before a
// backend may use it: fresh namespaces (a network namespace given by path
// must not be the host's), no capability, no_new_privs, a non-root user, a
// read-only root, a seccomp filter, resource limits, and mounts that neither
// escape nor grant exec, setuid or devices on writable paths.
func Validate(s *specs.Spec) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if s.Root == nil || !path.IsAbs(s.Root.Path) {
		bad("root path must be absolute")
	} else if !s.Root.Readonly {
		bad("root must be read-only")
	}
	p := s.Process
	if p == nil || len(p.Args) == 0 {
		bad("process args missing")
	} else {
		if p.User.UID == 0 || p.User.GID == 0 {
			bad("process must not run as root (uid %d gid %d)", p.User.UID, p.User.GID)
		}
		if !p.NoNewPrivileges {
			bad("no_new_privs must be set")
		}
		if p.Terminal {
			bad("terminal must be off")
		}
		if c := p.Capabilities; c == nil {
			bad("capabilities must be set explicitly (empty)")
		} else if n := len(c.Bounding) + len(c.Effective) + len(c.Inheritable) + len(c.Permitted) + len(c.Ambient); n != 0 {
			bad("capabilities must be empty, found %d", n)
		}
		if !path.IsAbs(p.Cwd) || strings.HasPrefix(path.Clean(p.Cwd), "/proc") {
			bad("cwd %q must be absolute and outside /proc", p.Cwd)
		}
	}
	l := s.Linux
	if l == nil {
		return errors.Join(append(errs, errors.New("linux section missing"))...)
	}
	if l.Seccomp == nil {
		bad("seccomp filter missing")
	} else if err := checkSeccomp(l.Seccomp); err != nil {
		errs = append(errs, err)
	}
	if len(l.UIDMappings)+len(l.GIDMappings) != 0 {
		bad("user namespace mappings are not used")
	}
	for _, want := range requiredNamespaces {
		i := slices.IndexFunc(l.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == want })
		switch {
		case i < 0:
			bad("%s namespace missing", want)
		case l.Namespaces[i].Path == "":
		case want != specs.NetworkNamespace:
			bad("%s namespace must be new, not joined from %q", want, l.Namespaces[i].Path)
		default:
			if err := notHostNetns(l.Namespaces[i].Path); err != nil {
				errs = append(errs, err)
			}
		}
	}
	r := l.Resources
	if r == nil || r.Memory == nil || r.Memory.Limit == nil || r.Pids == nil || r.Pids.Limit == nil || r.CPU == nil || r.CPU.Quota == nil {
		bad("memory, pids and cpu limits are required")
	} else if r.Memory.Swap == nil || *r.Memory.Swap != *r.Memory.Limit {
		bad("memory+swap must equal memory")
	}
	if l.CgroupsPath == "" {
		bad("cgroups path missing")
	}
	if !slices.Contains(l.MaskedPaths, "/proc/kcore") || !slices.Contains(l.ReadonlyPaths, "/proc/sys") {
		bad("masked and read-only paths missing")
	}
	for _, m := range s.Mounts {
		if !path.IsAbs(m.Destination) || path.Clean(m.Destination) != m.Destination {
			bad("mount destination %q must be absolute and clean", m.Destination)
		}
		if m.Type == "bind" {
			for _, o := range []string{"nosuid", "nodev"} {
				if !slices.Contains(m.Options, o) {
					bad("bind mount %s lacks %s", m.Destination, o)
				}
			}
			if !slices.Contains(m.Options, "ro") && !slices.Contains(m.Options, "noexec") {
				bad("writable bind mount %s lacks noexec", m.Destination)
			}
			if !slices.Contains(m.Options, "noexec") && m.Destination != InitPath {
				bad("bind mount %s lacks noexec (only the init at %s may be run from the host)", m.Destination, InitPath)
			}
		}
	}
	return errors.Join(errs...)
}

// notHostNetns refuses a network namespace path that names the namespace
// agentrun itself runs in.
func notHostNetns(p string) error {
	var ns, self unix.Stat_t
	if err := unix.Stat(p, &ns); err != nil {
		return fmt.Errorf("network namespace %q: %w", p, err)
	}
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return fmt.Errorf("own network namespace: %w", err)
	}
	if ns.Dev == self.Dev && ns.Ino == self.Ino {
		return fmt.Errorf("network namespace %q is the host's", p)
	}
	return nil
}
