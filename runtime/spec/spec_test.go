package spec

import (
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// valid returns a spec that Validate accepts.
func valid(t *testing.T, opts ...SpecOpt) *specs.Spec {
	t.Helper()
	base := []SpecOpt{WithArgs("python3", "-c", "pass"), WithCgroupsPath("/agentrun/t"), WithMemory(64 << 20),
		WithCPUs(0.5), WithPids(64), WithTmpSize(64<<20, 64<<20), WithSeccomp()}
	s, err := New("/rootfs", append(base, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func TestDefaultIsLockedDown(t *testing.T) {
	s := Default("/r")
	if s.Process.User.UID != 65534 || s.Process.User.GID != 65534 {
		t.Errorf("user = %+v; want 65534:65534", s.Process.User)
	}
	c := s.Process.Capabilities
	if len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("capabilities = %+v; want none", c)
	}
	if !s.Process.NoNewPrivileges || !s.Root.Readonly {
		t.Error("no_new_privs and read-only root must be on")
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Path != "" {
			t.Errorf("namespace %s joined from %q", ns.Type, ns.Path)
		}
		if ns.Type == specs.UserNamespace {
			t.Error("user namespace is not used")
		}
	}
	if len(s.Linux.Namespaces) != 6 {
		t.Errorf("namespaces = %d; want 6", len(s.Linux.Namespaces))
	}
	if d := s.Linux.Resources.Devices; len(d) != 1 || d[0].Allow || d[0].Access != "rwm" {
		t.Errorf("device rules = %+v; want deny all", d)
	}
	for _, want := range []string{"/proc/kcore", "/proc/keys", "/sys/firmware", "/proc/timer_list"} {
		if !slices.Contains(s.Linux.MaskedPaths, want) {
			t.Errorf("%s not masked", want)
		}
	}
	if !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sysrq-trigger") {
		t.Error("/proc/sys and /proc/sysrq-trigger must be read-only")
	}
	if got := rlimit(s, "RLIMIT_CORE"); got == nil || got.Hard != 0 {
		t.Errorf("RLIMIT_CORE = %+v; want 0", got)
	}
	tmp := mount(s, "/tmp")
	for _, o := range []string{"nosuid", "nodev", "noexec", "mode=1777"} {
		if !slices.Contains(tmp.Options, o) {
			t.Errorf("/tmp lacks %s: %v", o, tmp.Options)
		}
	}
	if !slices.Contains(mount(s, "/sys").Options, "ro") {
		t.Error("/sys must be read-only")
	}
	if s.Process.Env[0] != "PATH="+DefaultPath || s.Process.Env[1] != "HOME=/tmp" || len(s.Process.Env) != 2 {
		t.Errorf("env = %q", s.Process.Env)
	}
}

func rlimit(s *specs.Spec, typ string) *specs.POSIXRlimit {
	for i := range s.Process.Rlimits {
		if s.Process.Rlimits[i].Type == typ {
			return &s.Process.Rlimits[i]
		}
	}
	return nil
}

func mount(s *specs.Spec, dest string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dest {
			return &s.Mounts[i]
		}
	}
	return nil
}

func TestOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		opt   SpecOpt
		check func(*specs.Spec) string
	}{
		{"args", WithArgs("a", "b"), func(s *specs.Spec) string {
			return diff(strings.Join(s.Process.Args, " "), "a b")
		}},
		{"env", WithEnv(map[string]string{"B": "2", "A": "1"}), func(s *specs.Spec) string {
			return diff(strings.Join(s.Process.Env, " "), "PATH="+DefaultPath+" HOME=/tmp A=1 B=2")
		}},
		{"env list first, none before", WithEnvListFirst("PYTHONPATH", "/dev/m"), func(s *specs.Spec) string {
			return diff(strings.Join(s.Process.Env, " "), "PATH="+DefaultPath+" HOME=/tmp PYTHONPATH=/dev/m")
		}},
		{"env list first, before the task's", composed(WithEnv(map[string]string{"PYTHONPATH": "/w/lib:/w/x"}), WithEnvListFirst("PYTHONPATH", "/dev/m")), func(s *specs.Spec) string {
			return diff(strings.Join(s.Process.Env, " "), "PATH="+DefaultPath+" HOME=/tmp PYTHONPATH=/dev/m:/w/lib:/w/x")
		}},
		{"env list first, an empty one", composed(WithEnv(map[string]string{"PYTHONPATH": ""}), WithEnvListFirst("PYTHONPATH", "/dev/m")), func(s *specs.Spec) string {
			return diff(strings.Join(s.Process.Env, " "), "PATH="+DefaultPath+" HOME=/tmp PYTHONPATH=/dev/m")
		}},
		{"user", WithUser(100000, 100001), func(s *specs.Spec) string {
			u := s.Process.User
			return diff(u.UID, uint32(100000)) + diff(u.GID, uint32(100001)) + diff(len(u.AdditionalGids), 0)
		}},
		{"cgroups path", WithCgroupsPath("/agentrun/x"), func(s *specs.Spec) string { return diff(s.Linux.CgroupsPath, "/agentrun/x") }},
		{"memory", WithMemory(1 << 20), func(s *specs.Spec) string {
			m := s.Linux.Resources.Memory
			return diff(*m.Limit, int64(1<<20)) + diff(*m.Swap, int64(1<<20))
		}},
		{"cpus", WithCPUs(0.5), func(s *specs.Spec) string {
			c := s.Linux.Resources.CPU
			return diff(*c.Quota, int64(50000)) + diff(*c.Period, uint64(100000))
		}},
		{"cpus minimum quota", WithCPUs(0.001), func(s *specs.Spec) string { return diff(*s.Linux.Resources.CPU.Quota, int64(1000)) }},
		{"pids", WithPids(7), func(s *specs.Spec) string { return diff(*s.Linux.Resources.Pids.Limit, int64(7)) }},
		{"tmp size", WithTmpSize(4096, 8192), func(s *specs.Spec) string {
			return diff(slices.Contains(mount(s, "/tmp").Options, "size=4096"), true) +
				diff(slices.Contains(mount(s, "/dev/shm").Options, "size=4096"), true) +
				diff(rlimit(s, "RLIMIT_FSIZE").Hard, uint64(8192+1<<20))
		}},
		{"workspace", WithWorkspace("/run/ws"), func(s *specs.Spec) string {
			m := mount(s, "/workspace")
			return diff(m.Source, "/run/ws") + diff(strings.Join(m.Options, ","), "bind,rw,nosuid,nodev,noexec")
		}},
		{"readonly file", WithReadonlyFile("/run/resolv", "/etc/resolv.conf"), func(s *specs.Spec) string {
			return diff(slices.Contains(mount(s, "/etc/resolv.conf").Options, "ro"), true)
		}},
		{"netns", WithNetworkNamespace("/proc/1/fd/3"), func(s *specs.Spec) string {
			for _, ns := range s.Linux.Namespaces {
				if ns.Type == specs.NetworkNamespace {
					return diff(ns.Path, "/proc/1/fd/3")
				}
			}
			return "no network namespace"
		}},
		{"seccomp", WithSeccomp(), func(s *specs.Spec) string {
			if s.Linux.Seccomp == nil {
				return "no seccomp"
			}
			return diff(s.Linux.Seccomp.DefaultAction, specs.ActErrno)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := New("/r", tc.opt)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if d := tc.check(s); d != "" {
				t.Error(d)
			}
		})
	}
}

func diff[T comparable](got, want T) string {
	if got != want {
		return strings.TrimSpace(strings.Join([]string{"got", format(got), "want", format(want)}, " ")) + "; "
	}
	return ""
}

func format(v any) string { return strings.ReplaceAll(strings.TrimSpace(sprint(v)), "\n", " ") }

func TestOptionErrors(t *testing.T) {
	for name, opt := range map[string]SpecOpt{
		"empty args":      WithArgs(),
		"empty argv0":     WithArgs(""),
		"env PATH":        WithEnv(map[string]string{"PATH": "/evil"}),
		"env HOME":        WithEnv(map[string]string{"HOME": "/root"}),
		"env list PATH":   WithEnvListFirst("PATH", "/evil"),
		"relative cgroup": WithCgroupsPath("agentrun/x"),
		"zero memory":     WithMemory(0),
		"negative pids":   WithPids(-1),
		"zero cpus":       WithCPUs(0),
		"NaN cpus":        WithCPUs(nan()),
		"zero tmp":        WithTmpSize(0, 1),
		"relative ws":     WithWorkspace("ws"),
		"relative bind":   WithReadonlyFile("a", "/b"),
		"relative netns":  WithNetworkNamespace("ns"),
		"root uid":        WithUser(0, 100000),
		"root gid":        WithUser(100000, 0),
	} {
		if _, err := New("/r", opt); err == nil {
			t.Errorf("%s: New succeeded; want an error", name)
		}
	}
}

func TestSeccompDeniesExtraSyscalls(t *testing.T) {
	s := valid(t)
	for _, r := range s.Linux.Seccomp.Syscalls {
		if r.Action != specs.ActAllow {
			continue
		}
		for _, n := range r.Names {
			if slices.Contains(DeniedSyscalls, n) {
				t.Errorf("%s is allowed", n)
			}
			if slices.Contains([]string{"unshare", "setns", "mount", "keyctl", "add_key", "request_key", "userfaultfd", "io_uring_setup", "bpf", "kexec_load", "init_module"}, n) {
				t.Errorf("%s is allowed although the sandbox has no capabilities", n)
			}
			if n == "clone" && len(r.Args) == 0 {
				t.Error("clone allowed without a flags condition (CLONE_NEW* would pass)")
			}
		}
	}
	// The moby profile must still be there: a plausible number of rules.
	n := 0
	for _, r := range s.Linux.Seccomp.Syscalls {
		n += len(r.Names)
	}
	if n < 300 {
		t.Errorf("only %d syscalls named; want Docker's profile (300+)", n)
	}
}

func TestValidateAcceptsComposedSpec(t *testing.T) {
	if err := Validate(valid(t)); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestValidateRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*specs.Spec)
		want   string
	}{
		{"writable root", func(s *specs.Spec) { s.Root.Readonly = false }, "read-only"},
		{"root user", func(s *specs.Spec) { s.Process.User.UID = 0 }, "root"},
		{"capability", func(s *specs.Spec) { s.Process.Capabilities.Bounding = []string{"CAP_SYS_ADMIN"} }, "capabilities"},
		{"nil capabilities", func(s *specs.Spec) { s.Process.Capabilities = nil }, "capabilities"},
		{"no nnp", func(s *specs.Spec) { s.Process.NoNewPrivileges = false }, "no_new_privs"},
		{"terminal", func(s *specs.Spec) { s.Process.Terminal = true }, "terminal"},
		{"cwd in proc", func(s *specs.Spec) { s.Process.Cwd = "/proc/self/fd/3" }, "cwd"},
		{"no seccomp", func(s *specs.Spec) { s.Linux.Seccomp = nil }, "seccomp"},
		{"allow-all seccomp", func(s *specs.Spec) { s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow} }, "seccomp"},
		{"seccomp allows ptrace", func(s *specs.Spec) {
			cp := *s.Linux.Seccomp
			cp.Syscalls = append(slices.Clone(cp.Syscalls), specs.LinuxSyscall{Names: []string{"ptrace"}, Action: specs.ActAllow})
			s.Linux.Seccomp = &cp
		}, "ptrace"},
		{"seccomp allows clone3", func(s *specs.Spec) {
			cp := *s.Linux.Seccomp
			cp.Syscalls = append(slices.Clone(cp.Syscalls), specs.LinuxSyscall{Names: []string{"clone3"}, Action: specs.ActAllow})
			s.Linux.Seccomp = &cp
		}, "clone3"},
		{"host pid ns", func(s *specs.Spec) { s.Linux.Namespaces[0].Path = "/proc/1/ns/pid" }, "pid namespace"},
		{"missing mount ns", func(s *specs.Spec) {
			s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.MountNamespace })
		}, "mount namespace missing"},
		{"host netns", func(s *specs.Spec) { _ = WithNetworkNamespace("/proc/self/ns/net")(s) }, "host's"},
		{"user mappings", func(s *specs.Spec) { s.Linux.UIDMappings = []specs.LinuxIDMapping{{Size: 1}} }, "mappings"},
		{"no memory limit", func(s *specs.Spec) { s.Linux.Resources.Memory = nil }, "limits"},
		{"swap", func(s *specs.Spec) { v := int64(1 << 30); s.Linux.Resources.Memory.Swap = &v }, "swap"},
		{"no cgroup path", func(s *specs.Spec) { s.Linux.CgroupsPath = "" }, "cgroups path"},
		{"unmasked", func(s *specs.Spec) { s.Linux.MaskedPaths = nil }, "masked"},
		{"dirty mount", func(s *specs.Spec) { s.Mounts[0].Destination = "/tmp/../etc" }, "clean"},
		{"exec bind", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/x", Type: "bind", Source: "/y", Options: []string{"bind", "rw", "nosuid", "nodev"}})
		}, "noexec"},
		{"suid bind", func(s *specs.Spec) {
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/x", Type: "bind", Source: "/y", Options: []string{"bind", "ro", "nodev"}})
		}, "nosuid"},
		{"no args", func(s *specs.Spec) { s.Process.Args = nil }, "args"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := valid(t)
			tc.mutate(s)
			err := Validate(s)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate = %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestDefaultCapsSocketBuffers(t *testing.T) {
	s := Default("/r")
	for _, k := range []string{"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"} {
		f := strings.Fields(s.Linux.Sysctl[k])
		if len(f) != 3 || f[2] != "262144" {
			t.Errorf("sysctl %s = %q; want a 256 KiB maximum", k, s.Linux.Sysctl[k])
		}
	}
}

// composed applies opts in order, as one option.
func composed(opts ...SpecOpt) SpecOpt {
	return func(s *specs.Spec) error {
		for _, o := range opts {
			if err := o(s); err != nil {
				return err
			}
		}
		return nil
	}
}
