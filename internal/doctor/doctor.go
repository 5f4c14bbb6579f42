package doctor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/uidpool"
	"github.com/agentrun/agentrun/runtime/spec"
)

// Status is the outcome of one check.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn" // runs work, but something is missing or degraded
	Fail Status = "FAIL" // runs would fail
	Info Status = "info" // the host's own state, for the operator to judge: never a warning or failure
)

// Check is one line of the report.
type Check struct {
	Name   string
	Status Status
	Detail string
	Fix    string // how to fix a warning or failure
}

// Machinery is what doctor tries of the packages that make a sandbox, as a
// run uses them: internal/compose, which wires them for the runner, hands
// it in, so that doctor links no backend, libcontainer or netlink of its
// own.
type Machinery interface {
	// Network makes a run's network namespaces and the veth between
	// them, and removes them.
	Network() error
	// SeccompHelper is the agentrun-seccomp that cfg names: "" for none
	// (there is none beside the binary), an error for one that is unfit.
	SeccompHelper(cfg *config.Config) (string, error)
	// PrecompiledSeccomp compiles the sandbox's seccomp filter once, for
	// helper to load in each sandbox; an error says why it is not.
	PrecompiledSeccomp(helper string) error
	// SealBinary seals this binary for a container's init in dir, as
	// libcontainer does; copied says it had to copy the binary (size
	// bytes) into memory.
	SealBinary(dir string) (copied bool, size int64, err error)
}

// Run performs every check against the host and cfg, trying m's
// machinery.
func Run(ctx context.Context, cfg *config.Config, m Machinery) []Check {
	checks := []func(*config.Config) Check{
		checkRoot, checkKernel, checkUserns, checkBPF, checkIOUring, checkModules, checkCgroups, checkSeccomp, checkFilesystems,
		func(*config.Config) Check { return checkNamespaces(m) }, checkRunsc, checkInit,
		func(cfg *config.Config) Check { return checkSeccompHelper(cfg, m) }, checkStateDir,
		func(cfg *config.Config) Check { return checkBinarySeal(cfg, m) }, checkStoreDir, checkRunUIDs, checkClock,
		func(cfg *config.Config) Check { return checkImage(ctx, cfg) },
	}
	out := make([]Check, 0, len(checks))
	for _, c := range checks {
		if ctx.Err() != nil {
			break
		}
		out = append(out, c(cfg))
	}
	return out
}

// Failed reports whether any check failed.
func Failed(checks []Check) bool {
	for _, c := range checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Print writes checks as a table, with a fix under each that is not ok.
func Print(w io.Writer, checks []Check) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Detail)
		if c.Status != OK && c.Status != Info && c.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", c.Fix)
		}
	}
	return tw.Flush()
}

func checkRoot(*config.Config) Check {
	c := Check{Name: "root"}
	if os.Geteuid() != 0 {
		c.Status, c.Detail, c.Fix = Fail, fmt.Sprintf("running as uid %d", os.Geteuid()), "run agentrun as root (sudo agentrun ...)"
		return c
	}
	c.Status, c.Detail = OK, "uid 0"
	return c
}

func checkKernel(*config.Config) Check {
	c := Check{Name: "kernel"}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return Check{Name: "kernel", Status: Fail, Detail: err.Error()}
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	fmt.Sscanf(rel, "%d.%d", &major, &minor)
	c.Detail = rel + " " + runtime.GOARCH
	switch {
	case major < 4 || (major == 4 && minor < 18):
		c.Status, c.Fix = Fail, "a kernel 4.18 or newer is required (5.10+ recommended)"
	case major < 5 || (major == 5 && minor < 10):
		c.Status, c.Fix = Warn, "kernel 5.10+ is recommended (memory.peak, cgroup.kill, seccomp fixes)"
	default:
		c.Status = OK
	}
	return c
}

// requiredControllers limit every run.
var requiredControllers = []string{"memory", "pids", "cpu"}

func checkCgroups(*config.Config) Check {
	c := Check{Name: "cgroups"}
	var have []string
	mode := "v1"
	if cgroups.IsCgroup2UnifiedMode() {
		mode = "v2"
		b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return Check{Name: c.Name, Status: Fail, Detail: err.Error(), Fix: "mount cgroup2 at /sys/fs/cgroup"}
		}
		have = strings.Fields(string(b))
	} else {
		if cgroups.IsCgroup2HybridMode() {
			mode = "v1 (hybrid)"
		}
		for _, ctrl := range requiredControllers {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl)); err == nil {
				have = append(have, ctrl)
			}
		}
	}
	var missing []string
	for _, ctrl := range requiredControllers {
		if !slices.Contains(have, ctrl) {
			missing = append(missing, ctrl)
		}
	}
	c.Detail = mode + ": " + strings.Join(have, " ")
	if len(missing) > 0 {
		c.Status = Fail
		c.Detail += "; missing " + strings.Join(missing, " ")
		c.Fix = "enable the cgroup controllers " + strings.Join(missing, ", ") + " (kernel command line cgroup_enable=..., or delegate them to agentrun's cgroup under systemd)"
		return c
	}
	c.Status = OK
	return c
}

func checkSeccomp(*config.Config) Check {
	c := Check{Name: "seccomp"}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil || !bytes.Contains(status, []byte("\nSeccomp:")) {
		return Check{Name: c.Name, Status: Fail, Detail: "kernel has no seccomp", Fix: "use a kernel built with CONFIG_SECCOMP_FILTER"}
	}
	lib, ok := seccompLibrary()
	if !ok {
		return Check{Name: c.Name, Status: Fail, Detail: lib, Fix: "build agentrun with CGO_ENABLED=1 -tags seccomp and install libseccomp2 (make build)"}
	}
	c.Status, c.Detail = OK, "filter support in kernel; "+lib
	return c
}

func checkFilesystems(*config.Config) Check {
	c := Check{Name: "filesystems"}
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return Check{Name: c.Name, Status: Fail, Detail: err.Error()}
	}
	var missing []string
	for _, fs := range []string{"tmpfs", "overlay", "proc", "sysfs", "devpts", "mqueue"} {
		if !bytes.Contains(b, []byte("\t"+fs+"\n")) {
			missing = append(missing, fs)
		}
	}
	if len(missing) > 0 {
		c.Status, c.Detail = Fail, "missing "+strings.Join(missing, " ")
		c.Fix = "load the modules (modprobe " + strings.Join(missing, " ") + ")"
		if len(missing) == 1 && missing[0] == "overlay" {
			c.Status, c.Fix = Warn, "modprobe overlay (needed only for dir: images that lack mount points)"
		}
		return c
	}
	// A size-capped tmpfs must really mount.
	dir, err := os.MkdirTemp("", "agentrun-doctor-")
	if err != nil {
		return Check{Name: c.Name, Status: Fail, Detail: err.Error()}
	}
	defer os.Remove(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		return Check{Name: c.Name, Status: Fail, Detail: "tmpfs mount: " + err.Error(), Fix: "agentrun needs CAP_SYS_ADMIN in the host mount namespace"}
	}
	unix.Unmount(dir, unix.MNT_DETACH)
	c.Status, c.Detail = OK, "tmpfs (size-capped mount works), overlay, proc, sysfs, devpts, mqueue"
	return c
}

// checkNamespaces makes a run's network namespaces and their veth, as an
// allowlisted run does, and removes them.
func checkNamespaces(m Machinery) (c Check) {
	c = Check{Name: "namespaces"}
	for _, ns := range []string{"pid", "net", "ipc", "uts", "mnt", "cgroup"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			return Check{Name: c.Name, Status: Fail, Detail: "no " + ns + " namespace", Fix: "use a kernel with CONFIG_" + strings.ToUpper(ns) + "_NS"}
		}
	}
	if err := m.Network(); err != nil {
		return Check{Name: c.Name, Status: Fail, Detail: err.Error(), Fix: "agentrun needs CAP_NET_ADMIN and CAP_SYS_ADMIN; inside a container, run it privileged"}
	}
	c.Status, c.Detail = OK, "pid net ipc uts mnt cgroup; netns + veth creation works"
	return c
}

func checkRunsc(cfg *config.Config) Check {
	c := Check{Name: "runsc"}
	sev := Warn
	if cfg.Runtime == config.RuntimeRunsc {
		sev = Fail
	}
	out, err := exec.Command(cfg.Runsc.Path, "--version").Output()
	if err != nil {
		c.Status, c.Detail = sev, fmt.Sprintf("%s: %v", cfg.Runsc.Path, err)
		c.Fix = "install gVisor's runsc (test/runsc.sh) and set config key runsc.path; needed only for runtime runsc"
		return c
	}
	first, _, _ := strings.Cut(string(out), "\n")
	c.Status, c.Detail = OK, cfg.Runsc.Path+": "+strings.TrimSpace(first)
	return c
}

func checkInit(cfg *config.Config) Check {
	if err := spec.CheckInit(cfg.Init); err != nil {
		return Check{Name: "init", Status: Fail, Detail: err.Error(),
			Fix: "apt-get install tini (it ships " + config.DefaultInit + "), or set config key init to a static init"}
	}
	return Check{Name: "init", Status: OK, Detail: cfg.Init}
}

// checkSeccompHelper compiles the sandbox's seccomp filter as a run does
// (runtime/runc/seccomp.go): once, for agentrun-seccomp to load in each
// sandbox. Without the helper libcontainer compiles it in every
// container's init, which costs each run a few milliseconds of CPU.
func checkSeccompHelper(cfg *config.Config, m Machinery) Check {
	c := Check{Name: "seccomp helper"}
	if cfg.SeccompHelper == config.SeccompHelperOff {
		c.Status, c.Detail = OK, "off (config key seccomp_helper): libcontainer compiles the seccomp filter in every container's init"
		return c
	}
	helper, err := m.SeccompHelper(cfg)
	if err != nil {
		c.Status, c.Detail, c.Fix = Fail, err.Error(), "install agentrun-seccomp (make install, or the Debian package), or set config key seccomp_helper to \"\""
		return c
	}
	if helper == "" {
		c.Status, c.Detail = Warn, "no agentrun-seccomp beside the agentrun binary or in ../lib/agentrun: libcontainer compiles the seccomp filter in every container's init"
		c.Fix = "install agentrun-seccomp (make install, or the Debian package) or set config key seccomp_helper"
		return c
	}
	if err := m.PrecompiledSeccomp(helper); err != nil {
		c.Status, c.Detail = Warn, err.Error()
		c.Fix = "runs still work: libcontainer compiles the filter in every container's init"
		return c
	}
	c.Status, c.Detail = OK, helper+": the filter compiles once per process"
	return c
}

func checkStateDir(cfg *config.Config) Check { return checkDir("state dir", cfg.StateDir, "state_dir") }
func checkStoreDir(cfg *config.Config) Check { return checkDir("store dir", cfg.StoreDir, "store_dir") }

// checkBinarySeal: libcontainer seals this binary for each container's
// init (CVE-2019-5736), through a read-only overlayfs of the binary's
// directory and the container's state dir, at no cost. Where it cannot
// (a kernel without overlayfs's mount API, or a binary whose directory
// holds the state dir, which overlayfs refuses as overlapping layers), it
// copies the binary into a memfd for every container, which costs about
// as much as the rest of a run's set-up. It is tried here as a run tries
// it, in a state dir of its own under the runc backend's.
func checkBinarySeal(cfg *config.Config, m Machinery) Check {
	c := Check{Name: "binary seal"}
	dir := filepath.Join(cfg.StateDir, "runc")
	err := os.MkdirAll(dir, 0o700)
	tmp := ""
	if err == nil {
		tmp, err = os.MkdirTemp(dir, ".doctor-")
	}
	if err != nil {
		c.Status, c.Detail, c.Fix = Fail, err.Error(), "make "+cfg.StateDir+" writable by root, or set config key state_dir"
		return c
	}
	defer os.RemoveAll(tmp)
	copied, size, err := m.SealBinary(tmp)
	if err != nil {
		c.Status, c.Detail = Fail, "sealing this binary for a container's init: "+err.Error()
		return c
	}
	if !copied {
		c.Status, c.Detail = OK, "sealed read-only through overlayfs: no copy per container"
		return c
	}
	exe, _ := os.Readlink("/proc/self/exe")
	c.Status = Warn
	c.Detail = fmt.Sprintf("overlayfs cannot seal %s: libcontainer copies its %d MiB into memory for every container", exe, size>>20)
	c.Fix = "install agentrun in a directory that does not hold state_dir (" + cfg.StateDir + "), such as /usr/local/bin, on a kernel with overlayfs"
	return c
}

// checkRunUIDs: no host user or group holds an id that sandboxes run as,
// and where the ids are reserved: host-wide, or in a dir of this config's
// own, where another agentrun of the host does not see them.
func checkRunUIDs(cfg *config.Config) Check {
	c := Check{Name: "run uids"}
	r := fmt.Sprintf("%d to %d", cfg.RunUIDs.First, cfg.RunUIDs.First+cfg.RunUIDs.Count-1)
	dir := cfg.RunUIDs.ReservationsDir()
	held, _ := os.ReadDir(dir)
	where := fmt.Sprintf("reserved in %s (%d held)", dir, len(held))
	names, err := uidpool.HostNames(cfg.RunUIDs.First, cfg.RunUIDs.Count, "/etc/passwd", "/etc/group")
	switch {
	case err != nil:
		c.Status, c.Detail = Fail, err.Error()
	case len(names) > 0:
		c.Status, c.Detail = Fail, "ids "+r+" are held by "+strings.Join(names, ", ")
		c.Fix = "set config key run_uids to a range no host user or group holds"
	case dir != uidpool.DefaultDir:
		c.Status = Warn
		c.Detail = "ids " + r + ": no host user or group holds one; " + where + ", not host-wide in " + uidpool.DefaultDir +
			": another agentrun of this host whose range overlaps this one may give one id to two sandboxes"
		c.Fix = "leave config key run_uids.dir unset, or give this agentrun a range no other uses"
	default:
		c.Status, c.Detail = OK, "ids "+r+": no host user or group holds one; "+where+", host-wide: every agentrun of this host reserves there, whatever its state_dir"
	}
	return c
}

// checkDir makes sure dir exists (creating it 0700) and is writable.
func checkDir(name, dir, key string) Check {
	c := Check{Name: name}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Check{Name: name, Status: Fail, Detail: err.Error(), Fix: "make " + dir + " writable by root, or set config key " + key}
	}
	f, err := os.CreateTemp(dir, ".doctor-")
	if err != nil {
		return Check{Name: name, Status: Fail, Detail: err.Error(), Fix: "make " + dir + " writable by root, or set config key " + key}
	}
	f.Close()
	os.Remove(f.Name())
	var st unix.Statfs_t
	free := ""
	if unix.Statfs(dir, &st) == nil {
		free = fmt.Sprintf(", %d MiB free", st.Bavail*uint64(st.Bsize)>>20)
	}
	c.Status, c.Detail = OK, dir+" writable"+free
	return c
}

// imageCheckTimeout bounds the question to the default image's registry.
const imageCheckTimeout = 5 * time.Second

// checkImage checks that the config's default image can be had: in the
// store, on disk, or from a registry that answers within
// imageCheckTimeout (nothing is pulled).
func checkImage(ctx context.Context, cfg *config.Config) Check {
	c := Check{Name: "image"}
	st, err := image.Open(cfg.StoreDir)
	if err != nil {
		return Check{Name: c.Name, Status: Fail, Detail: err.Error(), Fix: "fix the store dir (store_dir) first"}
	}
	ctx, cancel := context.WithTimeout(ctx, imageCheckTimeout)
	defer cancel()
	where, err := st.Available(ctx, cfg.Image)
	if err != nil {
		return Check{Name: c.Name, Status: Fail, Detail: err.Error(),
			Fix: fmt.Sprintf("tasks without an image would fail: pull it while its source is reachable (agentrun pull %s), "+
				"or set the config's image to one that is (a local oci:, docker-archive: or dir: image needs no network)", cfg.Image)}
	}
	c.Status, c.Detail = OK, cfg.Image+": "+where
	return c
}

func checkClock(*config.Config) Check {
	c := Check{Name: "clock"}
	now := time.Now()
	if now.Year() < 2025 {
		return Check{Name: c.Name, Status: Warn, Detail: now.UTC().Format(time.RFC3339), Fix: "set the clock (timedatectl set-ntp true): audit records and registry TLS need it"}
	}
	c.Status, c.Detail = OK, now.UTC().Format(time.RFC3339)
	return c
}
