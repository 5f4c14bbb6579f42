package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
)

// sysctls is a host's /proc/sys: a name absent from it is not there.
type sysctls map[string]string

func (m sysctls) read(name string) (string, error) {
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("open /proc/sys/%s: %w", strings.ReplaceAll(name, ".", "/"), fs.ErrNotExist)
	}
	if v == "EACCES" {
		return "", errors.New("permission denied")
	}
	return v, nil
}

func TestExposure(t *testing.T) {
	for _, tc := range []struct {
		name   string
		check  func(sysctlFunc) Check
		host   sysctls
		status Status
		detail string // a part of the detail
	}{
		{"userns allowed", usernsExposure, sysctls{"user.max_user_namespaces": "63432", "kernel.unprivileged_userns_clone": "1"}, Info, "allowed to unprivileged processes of the host (user.max_user_namespaces=63432, kernel.unprivileged_userns_clone=1)"},
		{"userns upstream", usernsExposure, sysctls{"user.max_user_namespaces": "63432"}, Info, "(user.max_user_namespaces=63432); sandboxes"},
		{"userns off", usernsExposure, sysctls{"user.max_user_namespaces": "0", "kernel.unprivileged_userns_clone": "1"}, Info, "disabled (user.max_user_namespaces=0)"},
		{"userns root only", usernsExposure, sysctls{"user.max_user_namespaces": "100", "kernel.unprivileged_userns_clone": "0"}, Info, "root only"},
		{"userns apparmor", usernsExposure, sysctls{"user.max_user_namespaces": "100", "kernel.apparmor_restrict_unprivileged_userns": "1"}, Info, "AppArmor"},
		{"userns none", usernsExposure, sysctls{}, Info, "a kernel without user namespaces"},
		{"userns unreadable", usernsExposure, sysctls{"user.max_user_namespaces": "EACCES"}, Info, "unknown: permission denied"},
		{"bpf on", bpfExposure, sysctls{"kernel.unprivileged_bpf_disabled": "0"}, Warn, "allowed to unprivileged processes"},
		{"bpf locked", bpfExposure, sysctls{"kernel.unprivileged_bpf_disabled": "1"}, Info, "disabled until reboot"},
		{"bpf off", bpfExposure, sysctls{"kernel.unprivileged_bpf_disabled": "2"}, Info, "disabled (kernel.unprivileged_bpf_disabled=2)"},
		{"bpf absent", bpfExposure, sysctls{}, Info, "a kernel without bpf"},
		{"io_uring open", ioUringExposure, sysctls{"kernel.io_uring_disabled": "0"}, Info, "allowed to every process"},
		{"io_uring group", ioUringExposure, sysctls{"kernel.io_uring_disabled": "1", "kernel.io_uring_group": "977"}, Info, "root and group 977 only"},
		{"io_uring off", ioUringExposure, sysctls{"kernel.io_uring_disabled": "2"}, Info, "disabled (kernel.io_uring_disabled=2)"},
		{"io_uring old kernel", ioUringExposure, sysctls{}, Info, "a kernel before 6.6"},
		{"modules autoload", modulesExposure, sysctls{"kernel.modprobe": "/sbin/modprobe", "kernel.modules_disabled": "0"}, Info, "autoloaded on demand through /sbin/modprobe"},
		{"modules disabled", modulesExposure, sysctls{"kernel.modprobe": "/sbin/modprobe", "kernel.modules_disabled": "1"}, Info, "loading disabled"},
		{"modules no modprobe", modulesExposure, sysctls{"kernel.modprobe": "", "kernel.modules_disabled": "0"}, Info, `no autoloading (kernel.modprobe="")`},
		{"modules none", modulesExposure, sysctls{}, Info, "a kernel without loadable modules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.check(tc.host.read)
			if c.Status != tc.status || !strings.Contains(c.Detail, tc.detail) {
				t.Errorf("got %s %q; want %s with %q", c.Status, c.Detail, tc.status, tc.detail)
			}
			if c.Status == Warn && c.Fix == "" {
				t.Error("a warning without a fix")
			}
		})
	}
}

// TestProcSysctl reads this host's sysctls by their dotted names.
func TestProcSysctl(t *testing.T) {
	if v, err := procSysctl("kernel.ostype"); err != nil || v != "Linux" {
		t.Errorf(`procSysctl("kernel.ostype") = %q, %v; want "Linux"`, v, err)
	}
	if _, err := procSysctl("kernel.agentrun_none"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("procSysctl of a missing sysctl: %v; want fs.ErrNotExist", err)
	}
}
