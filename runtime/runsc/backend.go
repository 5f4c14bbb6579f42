package runsc

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/runtime"
)

// defaultCgroupParent holds the cgroups of runs whose spec names none.
const defaultCgroupParent = "/agentrun-runsc"

// runscFailure is runsc's own exit status when it could not run or wait for
// the container (the program's exit status otherwise).
const runscFailure = 128

// killGrace bounds how long the backend waits for runsc to end after
// `runsc kill`, and for one runsc housekeeping command.
const killGrace = 5 * time.Second

// reservedFlags are set by the backend itself; a config flag may not change
// them, as each one keeps the sandbox isolated or the run observable.
var reservedFlags = []string{
	"root", "network", "oci-seccomp", "log", "log-fd", "log-format", "debug-log-fd",
	"ignore-cgroups", "systemd-cgroup", "host-uds", "host-fifo", "host-settings",
}

// Backend runs containers with runsc. Create it with New.
type Backend struct {
	path     string   // the runsc binary
	flags    []string // extra global flags from the config (runsc.flags)
	stateDir string   // bundles (stateDir/<id>), runsc's state (stateDir/root)
	root     string
}

// New returns a backend running the runsc binary at path with the extra
// global flags, keeping bundles and runsc's state under stateDir.
func New(path string, flags []string, stateDir string) (*Backend, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("runsc not found at %s (config key runsc.path): %w", path, err)
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("runsc path %q is not absolute (config key runsc.path)", path)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return nil, fmt.Errorf("runsc at %s is not an executable file (config key runsc.path)", path)
	}
	for _, f := range flags {
		name, _, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		switch {
		case !strings.HasPrefix(f, "-") || name == "":
			return nil, fmt.Errorf("runsc flag %q is not a flag (config key runsc.flags)", f)
		case slices.Contains(reservedFlags, name) || strings.HasPrefix(strings.ToLower(name), "testonly"):
			return nil, fmt.Errorf("runsc flag %q is set by agentrun and may not be changed (config key runsc.flags)", f)
		}
	}
	if !filepath.IsAbs(stateDir) {
		return nil, fmt.Errorf("runsc state dir %q is not absolute", stateDir)
	}
	b := &Backend{path: path, flags: slices.Clone(flags), stateDir: stateDir, root: filepath.Join(stateDir, "root")}
	if err := os.MkdirAll(b.root, 0o700); err != nil {
		return nil, fmt.Errorf("creating runsc state dir: %w", err)
	}
	return b, nil
}

// Run writes the run's bundle and cgroup, runs the program in a runsc
// sandbox to its end or to the timeout, collects its output and usage, and
// removes everything it made.
func (b *Backend) Run(ctx context.Context, c *runtime.Container) (out *runtime.Outcome, err error) {
	if err := checkContainer(c); err != nil {
		return nil, err
	}
	cgPath := c.Spec.Linux.CgroupsPath
	if cgPath == "" {
		cgPath = defaultCgroupParent + "/" + c.ID
	}
	if !filepath.IsAbs(cgPath) || filepath.Clean(cgPath) != cgPath || cgPath == "/" {
		return nil, fmt.Errorf("cgroups path %q must be absolute and clean", cgPath)
	}
	bundle := filepath.Join(b.stateDir, c.ID)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("creating bundle dir: %w", err)
	}
	var cg *sandboxCgroup
	defer func() {
		if cerr := b.cleanup(c.ID, bundle, cg); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := writeConfig(bundle, c.Spec, cgPath); err != nil {
		return nil, err
	}

	unlock, err := lockCgroupParent(b.stateDir, false)
	if err != nil {
		return nil, err
	}
	cg, err = newCgroup(cgPath, c.Spec.Linux.Resources)
	unlock()
	if err != nil {
		return nil, err
	}

	stdio, err := newStdio()
	if err != nil {
		return nil, err
	}
	defer stdio.closeAll()

	cmd := exec.Command(b.path, b.args(c, bundle)...)
	cmd.Dir = bundle
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.inR, stdio.outW, stdio.errW
	// Its own process group, so that a stuck runsc can be killed whole.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting runsc: %w", err)
	}
	stdio.closeChildEnds()

	out = &runtime.Outcome{}
	var wg sync.WaitGroup
	wg.Go(func() { out.Stdout = runtime.Capture(stdio.outR, c.OutputLimit) })
	wg.Go(func() { out.Stderr = runtime.Capture(stdio.errR, c.OutputLimit) })
	go feed(stdio.inW, c.Stdin) // ends with EPIPE at the latest when the sandbox dies

	waited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // the status is in cmd.ProcessState
		close(waited)
	}()
	timer := time.NewTimer(c.Timeout)
	defer timer.Stop()
	select {
	case <-waited:
	case <-timer.C:
		out.TimedOut = true
		b.kill(c.ID, cmd, waited, cg)
	case <-ctx.Done():
		b.kill(c.ID, cmd, waited, cg)
	}
	out.Duration = time.Since(start)

	// runsc has ended; make sure the sandbox it ran has too, so that both
	// pipes reach EOF and the cgroup's figures are final.
	dead := b.ensureDead(c.ID, cg)
	wg.Wait()

	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled(): // runsc itself was killed
		out.ExitCode = 128 + int(ws.Signal())
		out.Signal = unix.SignalName(ws.Signal())
	default:
		out.ExitCode = ws.ExitStatus()
		if n := out.ExitCode - 128; n > 0 && n < 65 {
			out.Signal = unix.SignalName(syscall.Signal(n))
		}
	}
	out.CPU, out.MemoryPeak = cg.usage()
	out.OOMKilled = cg.oomKilled()
	if dead != nil {
		return out, dead
	}
	if ctx.Err() != nil {
		return out, fmt.Errorf("run cancelled: %w", ctx.Err())
	}
	if out.ExitCode == runscFailure && !out.TimedOut {
		if msg := runscError(filepath.Join(bundle, "runsc.log")); msg != "" {
			return out, fmt.Errorf("runsc failed: %s", msg)
		}
	}
	return out, nil
}

// args is runsc's command line for one run.
func (b *Backend) args(c *runtime.Container, bundle string) []string {
	network := "none" // loopback only, in a fresh namespace
	for _, ns := range c.Spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace && ns.Path != "" {
			// runsc starts the sandbox inside the spec's namespace and
			// takes over its interfaces.
			network = "sandbox"
		}
	}
	args := []string{
		"--root", b.root,
		"--platform=systrap",
		"--oci-seccomp",
		"--network=" + network,
		"--log=" + filepath.Join(bundle, "runsc.log"),
	}
	args = append(args, b.flags...)
	return append(args, "run", "--bundle", bundle, c.ID)
}

// kill ends a run that must stop now: `runsc kill` first, then, if runsc is
// still there after a grace period, its process group and every process in
// the cgroup. It returns once runsc has been waited for.
func (b *Backend) kill(id string, cmd *exec.Cmd, waited <-chan struct{}, cg *sandboxCgroup) {
	if b.runscCmd("kill", id, "KILL") == nil {
		select {
		case <-waited:
			return
		case <-time.After(killGrace):
		}
	}
	_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	_ = cg.kill()
	<-waited
}

// ensureDead removes the container from runsc if it still knows it, then
// kills whatever is left in the cgroup.
func (b *Backend) ensureDead(id string, cg *sandboxCgroup) error {
	var errs []error
	if b.hasState(id) {
		if err := b.runscCmd("delete", "--force", id); err != nil {
			errs = append(errs, err)
		}
	}
	if cg != nil {
		if err := cg.kill(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanup removes everything a run made, whatever state it is in.
func (b *Backend) cleanup(id, bundle string, cg *sandboxCgroup) error {
	errs := []error{b.ensureDead(id, cg)}
	if cg != nil {
		errs = append(errs, cg.remove())
		if unlock, err := lockCgroupParent(b.stateDir, true); err == nil {
			cg.removeParent() // fails while another run's cgroup is in it
			unlock()
		}
	}
	if err := os.RemoveAll(bundle); err != nil {
		errs = append(errs, fmt.Errorf("removing bundle: %w", err))
	}
	for _, p := range b.stateFiles(id) {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing runsc state: %w", err))
		}
	}
	return errors.Join(errs...)
}

// stateFiles lists what runsc keeps under --root for the container id:
// "<sandbox>_sand:<id>.state" and its lock, and per-container dirs.
func (b *Backend) stateFiles(id string) []string {
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		base := strings.TrimSuffix(strings.TrimSuffix(n, ".lock"), ".state")
		if n == id || base == id || strings.HasSuffix(base, ":"+id) || strings.HasPrefix(base, id+"_") {
			out = append(out, filepath.Join(b.root, n))
		}
	}
	return out
}

func (b *Backend) hasState(id string) bool { return len(b.stateFiles(id)) > 0 }

// runscCmd runs one runsc housekeeping command against the backend's state,
// bounded by killGrace.
func (b *Backend) runscCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), killGrace)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.path, append([]string{"--root", b.root}, args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// runscError returns the first error runsc logged in its log file, if any.
func runscError(logFile string) string {
	f, err := os.Open(logFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct{ Msg, Level string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Level == "error" && e.Msg != "" {
			return e.Msg
		}
	}
	return ""
}

// writeConfig writes the spec as the bundle's config.json; only its cgroups
// path is set here. Its root stays the shared, read-only image rootfs.
func writeConfig(bundle string, s *specs.Spec, cgPath string) error {
	cp := *s
	linux := *s.Linux
	linux.CgroupsPath = cgPath
	cp.Linux = &linux
	data, err := json.Marshal(&cp)
	if err != nil {
		return fmt.Errorf("encoding config.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return fmt.Errorf("writing config.json: %w", err)
	}
	return nil
}

// checkContainer refuses what the backend cannot run safely.
func checkContainer(c *runtime.Container) error {
	if c == nil || c.Spec == nil || c.Spec.Linux == nil || c.Spec.Process == nil || c.Spec.Root == nil {
		return errors.New("container spec incomplete")
	}
	if !validID(c.ID) {
		return fmt.Errorf("container id %q must be 1-64 of [a-z0-9-] and not \"root\"", c.ID)
	}
	if !filepath.IsAbs(c.Spec.Root.Path) {
		return fmt.Errorf("root path %q is not absolute", c.Spec.Root.Path)
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("timeout %v is not positive", c.Timeout)
	}
	return nil
}

func validID(id string) bool {
	if id == "" || len(id) > 64 || id == "root" {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// lockCgroupParent takes a lock that makes creating a run's cgroup and
// removing the empty shared parent cgroup mutually exclusive, across
// processes. exclusive=true does not wait: if another run is being created,
// it reports an error and the parent stays.
func lockCgroupParent(stateDir string, exclusive bool) (func(), error) {
	f, err := os.OpenFile(filepath.Join(stateDir, "cgroup.lock"), os.O_RDONLY|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening cgroup lock: %w", err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX | unix.LOCK_NB
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking cgroup parent: %w", err)
	}
	return func() { f.Close() }, nil
}
