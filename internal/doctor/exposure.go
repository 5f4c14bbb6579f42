package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
)

// The host's own kernel exposure: what a process of the host, outside
// any sandbox, can reach. A sandbox's filter refuses all of it whatever
// the host allows (docs/security.md, the kernel surface); these lines say
// what is left to the host's other processes, as information, and warn
// only of unprivileged bpf, which no distribution leaves on by default.

// sysctlFunc reads one sysctl by its dotted name (kernel.modprobe), its
// value trimmed; an error matching fs.ErrNotExist when the kernel has none.
type sysctlFunc func(name string) (string, error)

// procSysctl reads a sysctl from /proc/sys.
func procSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/")))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func checkUserns(*config.Config) Check  { return usernsExposure(procSysctl) }
func checkBPF(*config.Config) Check     { return bpfExposure(procSysctl) }
func checkIOUring(*config.Config) Check { return ioUringExposure(procSysctl) }
func checkModules(*config.Config) Check { return modulesExposure(procSysctl) }

// usernsExposure: whether an unprivileged process can make a user
// namespace, and with it reach the kernel code that needs
// CAP_SYS_ADMIN or CAP_NET_ADMIN in one (netfilter, mounts of some
// filesystems).
func usernsExposure(read sysctlFunc) Check {
	c := Check{Name: "user namespaces", Status: Info}
	max, maxErr := read("user.max_user_namespaces")
	clone, cloneErr := read("kernel.unprivileged_userns_clone")
	apparmor, _ := read("kernel.apparmor_restrict_unprivileged_userns")
	switch {
	case maxErr != nil && errors.Is(maxErr, fs.ErrNotExist):
		c.Detail = "none (no user.max_user_namespaces: a kernel without user namespaces)"
	case maxErr != nil:
		c.Detail = "unknown: " + maxErr.Error()
	case max == "0":
		c.Detail = "disabled (user.max_user_namespaces=0)"
	case cloneErr == nil && clone == "0":
		c.Detail = "root only (kernel.unprivileged_userns_clone=0)"
	case apparmor == "1":
		c.Detail = "unprivileged ones confined by AppArmor (kernel.apparmor_restrict_unprivileged_userns=1)"
	default:
		c.Detail = fmt.Sprintf("allowed to unprivileged processes of the host (user.max_user_namespaces=%s", max)
		if cloneErr == nil {
			c.Detail += ", kernel.unprivileged_userns_clone=" + clone
		}
		c.Detail += "); sandboxes cannot make one"
	}
	return c
}

// bpfExposure: whether an unprivileged process can load BPF programs.
func bpfExposure(read sysctlFunc) Check {
	c := Check{Name: "unprivileged bpf", Status: Info}
	v, err := read("kernel.unprivileged_bpf_disabled")
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		c.Detail = "no kernel.unprivileged_bpf_disabled (a kernel without bpf)"
	case err != nil:
		c.Detail = "unknown: " + err.Error()
	case v == "1":
		c.Detail = "disabled until reboot (kernel.unprivileged_bpf_disabled=1)"
	case v == "2":
		c.Detail = "disabled (kernel.unprivileged_bpf_disabled=2)"
	case v == "0":
		c.Status = Warn
		c.Detail = "allowed to unprivileged processes of the host (kernel.unprivileged_bpf_disabled=0); sandboxes cannot"
		c.Fix = "sysctl -w kernel.unprivileged_bpf_disabled=2 (and keep it in /etc/sysctl.d)"
	default:
		c.Detail = "kernel.unprivileged_bpf_disabled=" + v
	}
	return c
}

// ioUringExposure: who may set up an io_uring (kernel.io_uring_disabled,
// from Linux 6.6).
func ioUringExposure(read sysctlFunc) Check {
	c := Check{Name: "io_uring", Status: Info}
	v, err := read("kernel.io_uring_disabled")
	switch {
	case err != nil && errors.Is(err, fs.ErrNotExist):
		c.Detail = "no kernel.io_uring_disabled (a kernel before 6.6, or one without io_uring): where it has io_uring, every process of the host may use it; sandboxes cannot"
	case err != nil:
		c.Detail = "unknown: " + err.Error()
	case v == "0":
		c.Detail = "allowed to every process of the host (kernel.io_uring_disabled=0); sandboxes cannot"
	case v == "1":
		gid, _ := read("kernel.io_uring_group")
		c.Detail = "root and group " + orUnknown(gid) + " only (kernel.io_uring_disabled=1, kernel.io_uring_group)"
	case v == "2":
		c.Detail = "disabled (kernel.io_uring_disabled=2)"
	default:
		c.Detail = "kernel.io_uring_disabled=" + v
	}
	return c
}

// modulesExposure: whether the kernel loads modules, and on demand (a
// socket family, a TCP ULP, a line discipline or a filesystem asked for
// by any process loads its module through kernel.modprobe).
func modulesExposure(read sysctlFunc) Check {
	c := Check{Name: "modules", Status: Info}
	disabled, derr := read("kernel.modules_disabled")
	modprobe, merr := read("kernel.modprobe")
	switch {
	case derr != nil && merr != nil && errors.Is(derr, fs.ErrNotExist) && errors.Is(merr, fs.ErrNotExist):
		c.Detail = "none (a kernel without loadable modules)"
	case derr == nil && disabled == "1":
		c.Detail = "loading disabled (kernel.modules_disabled=1)"
	case merr != nil:
		c.Detail = "unknown: " + merr.Error()
	case modprobe == "" || modprobe == "/bin/false" || modprobe == "/bin/true":
		c.Detail = fmt.Sprintf("no autoloading (kernel.modprobe=%q); root may still load modules", modprobe)
	default:
		c.Detail = "autoloaded on demand through " + modprobe + " (kernel.modprobe): a socket family, protocol or line discipline a host process asks for loads its module; a sandbox's filter refuses them first"
	}
	return c
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
