package spec

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Sandbox identity inside the container.
const (
	// UID and GID are "nobody": a spec's default user, and the owner of
	// kept session disks. The runner gives each sandbox a host id of its
	// own instead (internal/uidpool).
	UID = 65534
	GID = 65534

	// Hostname is the UTS name every sandbox sees.
	Hostname = "sandbox"

	// WorkspaceDir is where the task's files and code live inside the sandbox.
	WorkspaceDir = "/workspace"

	// DefaultPath is the PATH a sandboxed program gets.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	// nofile is the open-file limit of a sandboxed process (soft and hard).
	nofile = 1024

	// SocketBuffer is the largest TCP receive and send buffer of one socket
	// in the sandbox's network namespace (net.ipv4.tcp_rmem and tcp_wmem,
	// which are per namespace). With nofile it bounds what one process can
	// hold in socket buffers; the memory cgroup bounds the run (see
	// backend.ChargeSocketMemory).
	SocketBuffer = 256 << 10
)

// MaskedPaths are hidden from the sandbox: /proc and /sys entries that leak
// host information or reach kernel interfaces (the Docker v28 list).
var MaskedPaths = []string{
	"/proc/acpi",
	"/proc/asound",
	"/proc/interrupts",
	"/proc/kcore",
	"/proc/keys",
	"/proc/latency_stats",
	"/proc/sched_debug",
	"/proc/scsi",
	"/proc/timer_list",
	"/proc/timer_stats",
	"/sys/devices/virtual/powercap",
	"/sys/firmware",
}

// ReadonlyPaths are visible but read-only inside the sandbox.
var ReadonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",
	"/proc/sysrq-trigger",
}

// SpecOpt changes one concern of a spec. Options may be applied in any order.
type SpecOpt func(*specs.Spec) error

// Default returns the locked-down spec for a sandbox whose root filesystem is
// rootfs: user nobody, no capabilities, no_new_privs, read-only root, fresh
// namespaces of every kind but user (network included: it holds only lo),
// masked and read-only /proc and /sys paths, a minimal /dev, a noexec /tmp,
// every device denied but the standard ones, core dumps off.
//
// Default has no process arguments, resource limits or seccomp filter: the
// caller adds them with options, and Validate refuses a spec that lacks them.
func Default(rootfs string) *specs.Spec {
	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: rootfs, Readonly: true},
		Process: &specs.Process{
			User: specs.User{UID: UID, GID: GID},
			Env:  []string{"PATH=" + DefaultPath, "HOME=/tmp"},
			Cwd:  WorkspaceDir,
			Capabilities: &specs.LinuxCapabilities{
				Bounding:    []string{},
				Effective:   []string{},
				Inheritable: []string{},
				Permitted:   []string{},
				Ambient:     []string{},
			},
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile},
				{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
			},
			NoNewPrivileges: true,
			// Under host memory pressure the sandbox dies first.
			OOMScoreAdj: intPtr(1000),
		},
		Hostname: Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=64k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=64m"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=64m"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
			},
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Sysctl: map[string]string{
				"net.ipv4.tcp_rmem": fmt.Sprintf("4096 65536 %d", SocketBuffer),
				"net.ipv4.tcp_wmem": fmt.Sprintf("4096 16384 %d", SocketBuffer),
			},
			MaskedPaths:       append([]string(nil), MaskedPaths...),
			ReadonlyPaths:     append([]string(nil), ReadonlyPaths...),
			RootfsPropagation: "private",
		},
	}
}

// New returns Default(rootfs) changed by opts, in order.
func New(rootfs string, opts ...SpecOpt) (*specs.Spec, error) {
	s := Default(rootfs)
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// WithArgs sets the program's argv; it is run directly, never through a
// shell (under the init, when WithInit is applied too, in either order).
func WithArgs(argv ...string) SpecOpt {
	return func(s *specs.Spec) error {
		if len(argv) == 0 || argv[0] == "" {
			return fmt.Errorf("empty argv")
		}
		s.Process.Args = append([]string(nil), argv...)
		if hasInit(s) {
			s.Process.Args = append([]string{InitPath, "--"}, s.Process.Args...)
		}
		return nil
	}
}

// WithUser runs the program as host uid and gid (the sandbox's own,
// internal/uidpool), with no supplementary groups, in place of UID and
// GID. Root is refused.
func WithUser(uid, gid uint32) SpecOpt {
	return func(s *specs.Spec) error {
		if uid == 0 || gid == 0 {
			return fmt.Errorf("user %d:%d: the program may not run as root", uid, gid)
		}
		s.Process.User = specs.User{UID: uid, GID: gid}
		return nil
	}
}

// InitPath is where the sandbox's init is mounted: in the sandbox's own
// /dev tmpfs, so that no image needs a mount point for it.
const InitPath = "/dev/init"

// WithInit runs the program under a minimal init, the static binary at
// host path bin (tini), bind-mounted read-only at InitPath: the init is
// pid 1 of the sandbox, so the program gets the kernel's default signal
// actions (a program's abort() or its own SIGTERM ends it), its orphans are
// reaped instead of staying zombies against the pids cap, and its end by
// signal n is reported as 128+n. The init takes one of the pids; the
// caller adds it to the program's.
func WithInit(bin string) SpecOpt {
	return func(s *specs.Spec) error {
		if bin == "" || bin[0] != '/' {
			return fmt.Errorf("init %q is not absolute", bin)
		}
		if hasInit(s) {
			return fmt.Errorf("init given twice")
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: InitPath, Type: "bind", Source: bin,
			Options: []string{"bind", "ro", "nosuid", "nodev"},
		})
		if len(s.Process.Args) > 0 {
			s.Process.Args = append([]string{InitPath, "--"}, s.Process.Args...)
		}
		return nil
	}
}

func hasInit(s *specs.Spec) bool {
	return slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == InitPath })
}

// WithEnv adds variables to the environment. PATH and HOME keep their
// sandbox values: env may not change them.
func WithEnv(env map[string]string) SpecOpt {
	return func(s *specs.Spec) error {
		for _, k := range slices.Sorted(maps.Keys(env)) {
			if k == "PATH" || k == "HOME" || k == "" {
				return fmt.Errorf("env: %q may not be set", k)
			}
			s.Process.Env = append(s.Process.Env, k+"="+env[k])
		}
		return nil
	}
}

// WithEnvListFirst puts dir first in the list variable name (such as
// PYTHONPATH), before the value it has so far, joined by ':'; name is
// dir alone if it has none.
func WithEnvListFirst(name, dir string) SpecOpt {
	return func(s *specs.Spec) error {
		if name == "PATH" || name == "HOME" || name == "" {
			return fmt.Errorf("env: %q may not be set", name)
		}
		for i, kv := range s.Process.Env {
			if v, ok := strings.CutPrefix(kv, name+"="); ok {
				if v != "" {
					dir += ":" + v
				}
				s.Process.Env[i] = name + "=" + dir
				return nil
			}
		}
		s.Process.Env = append(s.Process.Env, name+"="+dir)
		return nil
	}
}

// WithCgroupsPath places the run's cgroup at path (absolute, e.g. /agentrun/ID).
func WithCgroupsPath(path string) SpecOpt {
	return func(s *specs.Spec) error {
		if len(path) < 2 || path[0] != '/' {
			return fmt.Errorf("cgroups path %q is not absolute", path)
		}
		s.Linux.CgroupsPath = path
		return nil
	}
}

// WithMemory caps memory at limit bytes with no swap (memory+swap = limit).
func WithMemory(limit int64) SpecOpt {
	return func(s *specs.Spec) error {
		if limit <= 0 {
			return fmt.Errorf("memory limit %d is not positive", limit)
		}
		s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit, Swap: int64Ptr(limit)}
		return nil
	}
}

// cpuPeriod is the CFS period used with WithCPUs, in microseconds.
const cpuPeriod = 100000

// WithCPUs caps CPU time at cpus cores (CFS quota over a 100 ms period).
func WithCPUs(cpus float64) SpecOpt {
	return func(s *specs.Spec) error {
		if !(cpus > 0) || cpus > 4096 {
			return fmt.Errorf("cpus %v out of range", cpus)
		}
		quota := int64(cpus * cpuPeriod)
		if quota < 1000 {
			quota = 1000 // the kernel's minimum quota is 1 ms
		}
		s.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: uint64Ptr(cpuPeriod)}
		return nil
	}
}

// WithPids caps the number of tasks (processes and threads) in the sandbox.
func WithPids(limit int64) SpecOpt {
	return func(s *specs.Spec) error {
		if limit <= 0 {
			return fmt.Errorf("pids limit %d is not positive", limit)
		}
		s.Linux.Resources.Pids = &specs.LinuxPids{Limit: &limit}
		return nil
	}
}

// WithTmpSize sets the size of the /tmp and /dev/shm tmpfs in bytes, and the
// largest file a process may write (RLIMIT_FSIZE) just above the bigger of
// that and workspace, so that a full filesystem answers ENOSPC first.
func WithTmpSize(tmp, workspace int64) SpecOpt {
	return func(s *specs.Spec) error {
		if tmp <= 0 || workspace <= 0 {
			return fmt.Errorf("tmp size %d and workspace size %d must be positive", tmp, workspace)
		}
		for i := range s.Mounts {
			switch s.Mounts[i].Destination {
			case "/tmp", "/dev/shm":
				s.Mounts[i].Options = setOption(s.Mounts[i].Options, "size", strconv.FormatInt(tmp, 10))
			}
		}
		fsize := uint64(max(tmp, workspace)) + 1<<20
		setRlimit(s, "RLIMIT_FSIZE", fsize, fsize)
		return nil
	}
}

// WithWorkspace bind-mounts the host directory dir (the run's own size-capped
// tmpfs) at /workspace, writable, without exec, setuid or devices.
func WithWorkspace(dir string) SpecOpt {
	return func(s *specs.Spec) error {
		if dir == "" || dir[0] != '/' {
			return fmt.Errorf("workspace %q is not absolute", dir)
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: WorkspaceDir, Type: "bind", Source: dir,
			Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"},
		})
		return nil
	}
}

// WithWorkspaceSlave makes the /workspace mount (WithWorkspace, before it)
// a slave of its host directory's: what the host mounts on that
// directory later, once the directory's mount is shared, appears at
// /workspace too, and nothing mounted in the sandbox reaches the host.
// A sandbox prepared ahead gets a kept session's disk so.
func WithWorkspaceSlave() SpecOpt {
	return func(s *specs.Spec) error {
		for i := range s.Mounts {
			if s.Mounts[i].Destination == WorkspaceDir {
				s.Mounts[i].Options = append(s.Mounts[i].Options, "rslave")
				return nil
			}
		}
		return fmt.Errorf("no %s mount to make a slave", WorkspaceDir)
	}
}

// WithReadonlyFile bind-mounts the host file src at dest, read-only.
func WithReadonlyFile(src, dest string) SpecOpt {
	return func(s *specs.Spec) error {
		if src == "" || src[0] != '/' || dest == "" || dest[0] != '/' {
			return fmt.Errorf("bind %q -> %q: paths must be absolute", src, dest)
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: dest, Type: "bind", Source: src,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
		})
		return nil
	}
}

// WithWritableDir bind-mounts the host directory src at dest, writable,
// without exec, setuid or devices.
func WithWritableDir(src, dest string) SpecOpt {
	return func(s *specs.Spec) error {
		if src == "" || src[0] != '/' || dest == "" || dest[0] != '/' {
			return fmt.Errorf("bind %q -> %q: paths must be absolute", src, dest)
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: dest, Type: "bind", Source: src,
			Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"},
		})
		return nil
	}
}

// WithTmpDir makes /tmp the host directory dir (a size-capped tmpfs the
// host made, as the workspace's is) bind-mounted writable, without exec,
// setuid or devices, in place of the sandbox's own tmpfs: a live sandbox's,
// whose /tmp the host reaches through it, link-safe (internal/safefs),
// where the sandbox's own tmpfs is in its mount namespace alone.
func WithTmpDir(dir string) SpecOpt {
	return func(s *specs.Spec) error {
		if dir == "" || dir[0] != '/' {
			return fmt.Errorf("tmp dir %q is not absolute", dir)
		}
		for i := range s.Mounts {
			if s.Mounts[i].Destination == "/tmp" {
				s.Mounts[i] = specs.Mount{Destination: "/tmp", Type: "bind", Source: dir,
					Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}}
				return nil
			}
		}
		return fmt.Errorf("no /tmp mount to replace")
	}
}

// WithNetworkNamespace joins the network namespace at path (agentrun's own
// sandbox namespace, held by an fd) instead of a new empty one.
func WithNetworkNamespace(path string) SpecOpt {
	return func(s *specs.Spec) error {
		if path == "" || path[0] != '/' {
			return fmt.Errorf("network namespace path %q is not absolute", path)
		}
		for i := range s.Linux.Namespaces {
			if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = path
				return nil
			}
		}
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: path})
		return nil
	}
}

func setRlimit(s *specs.Spec, typ string, soft, hard uint64) {
	for i := range s.Process.Rlimits {
		if s.Process.Rlimits[i].Type == typ {
			s.Process.Rlimits[i].Soft, s.Process.Rlimits[i].Hard = soft, hard
			return
		}
	}
	s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: typ, Soft: soft, Hard: hard})
}

// setOption replaces (or adds) key=value in a mount option list.
func setOption(opts []string, key, value string) []string {
	out := make([]string, 0, len(opts)+1)
	for _, o := range opts {
		if len(o) > len(key) && o[:len(key)+1] == key+"=" {
			continue
		}
		out = append(out, o)
	}
	return append(out, key+"="+value)
}

func intPtr(v int) *int          { return &v }
func int64Ptr(v int64) *int64    { return &v }
func uint64Ptr(v uint64) *uint64 { return &v }
