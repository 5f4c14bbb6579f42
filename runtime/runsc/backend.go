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
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// defaultCgroupParent holds the cgroups of runs whose spec names none.
const defaultCgroupParent = CgroupParent

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
	"ignore-cgroups", "systemd-cgroup", "host-uds", "host-fifo", "host-settings", "gofer-network-namespace",
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

// Traits: runsc's gofer writes the mount points it needs into the root
// filesystem, so a run needs its own; the backend changes the spec
// (SpecOpt); a sandbox is created and run in one step, so none is pooled.
func (b *Backend) Traits() backend.Traits {
	return backend.Traits{CgroupParent: CgroupParent, PrivateRootfs: true, Spec: SpecOpt()}
}

// prepared is a container checked and recorded for its run: runsc creates
// the sandbox and runs the program in one step, Run's, which removes
// everything it made before it returns.
type prepared struct {
	b   *Backend
	c   backend.Container
	ran bool
}

// Prepare checks c and records it for Run; it makes nothing on the host.
func (b *Backend) Prepare(_ context.Context, c *backend.Container) (backend.Prepared, error) {
	if err := checkContainer(c); err != nil {
		return nil, err
	}
	return &prepared{b: b, c: *c}, nil
}

func (p *prepared) Run(ctx context.Context, stdin []byte, timeout time.Duration, outputLimit int64, output backend.OutputFunc) (*backend.Outcome, error) {
	if p.ran {
		return nil, errors.New("container already ran")
	}
	p.ran = true
	c := p.c
	c.Stdin, c.Timeout, c.OutputLimit, c.Output = stdin, timeout, outputLimit, output
	return p.b.Run(ctx, &c)
}

func (p *prepared) Ready() bool { return !p.ran }

// Destroy has nothing to remove: Run removed all it made.
func (p *prepared) Destroy() error { return nil }

// Run writes the run's bundle and cgroup, runs the program in a runsc
// sandbox to its end or to the timeout, collects its output and usage, and
// removes everything it made.
func (b *Backend) Run(ctx context.Context, c *backend.Container) (out *backend.Outcome, err error) {
	if err := checkContainer(c); err != nil {
		return nil, err
	}
	if c.Timeout <= 0 {
		return nil, fmt.Errorf("timeout %v is not positive", c.Timeout)
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
	var cg *cgroup.Cgroup
	defer func() {
		if cerr := b.cleanup(c.ID, bundle, cg); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if err := writeConfig(bundle, c.Spec, cgPath); err != nil {
		return nil, err
	}

	unlock, err := state.LockCgroupParent(b.stateDir, false)
	if err != nil {
		return nil, err
	}
	cg, err = cgroup.New(cgPath, c.Spec.Linux.Resources)
	unlock()
	if err != nil {
		return nil, err
	}

	stdio, err := backend.NewPipes()
	if err != nil {
		return nil, err
	}
	defer stdio.CloseAll()
	if err := socketOutputs(stdio); err != nil {
		return nil, err
	}

	cmd := exec.Command(b.path, b.args(c, bundle)...)
	cmd.Dir = bundle
	cmd.Env = []string{"PATH=" + spec.DefaultPath}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.InR, stdio.OutW, stdio.ErrW
	// Its own process group, so that a stuck runsc can be killed whole;
	// killed with agentrun, so that an agentrun that dies leaves no runsc
	// going on (runsc run, attached, takes its sandbox and gofer with it)
	// to write state after gc has looked.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	started, waited := make(chan error, 1), make(chan *os.ProcessState, 1)
	go func() {
		// The parent-death signal follows the thread that started runsc,
		// not the process: the thread is kept to this goroutine, alive,
		// until runsc has been waited for.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait() // the status is in cmd.ProcessState
		waited <- cmd.ProcessState
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting runsc: %w", err)
	}
	stdio.CloseChildEnds()

	out = &backend.Outcome{}
	waitOutput := stdio.Serve(c.Stdin, c.OutputLimit, c.Output)

	ps, timedOut := backend.Watch(ctx, c.Timeout, waited, func() *os.ProcessState { return b.kill(c.ID, cmd, waited, cg) })
	out.Duration = time.Since(start)

	// runsc has ended; make sure the sandbox it ran has too, so that both
	// pipes reach EOF and the cgroup's figures are final.
	dead := b.ensureDead(c.ID, cg)
	out.Stdout, out.Stderr = waitOutput()

	out.SetExit(ps, timedOut) // signalled: runsc itself was killed
	u := cg.Usage()
	out.CPU, out.MemoryPeak, out.OOMKilled = u.CPU, u.MemoryPeak, u.OOMKilled
	if dead != nil {
		return out, dead
	}
	if ctx.Err() != nil {
		return out, fmt.Errorf("run cancelled: %w", ctx.Err())
	}
	if out.ExitCode == runscFailure && !out.TimedOut {
		// runsc could not start or wait for the program (e.g. no such
		// program); its stderr then holds runsc's own message, not the
		// program's, so no outcome is returned, as with libcontainer.
		if msg := runscError(filepath.Join(bundle, "runsc.log")); msg != "" {
			return nil, fmt.Errorf("runsc failed: %s", msg)
		}
	}
	return out, nil
}

// args is runsc's command line for one run.
func (b *Backend) args(c *backend.Container, bundle string) []string {
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
		"--gofer-network-namespace=new",
		"--log=" + filepath.Join(bundle, "runsc.log"),
	}
	args = append(args, b.flags...)
	return append(args, "run", "--bundle", bundle, c.ID)
}

// kill ends a run that must stop now: `runsc kill` first, then, if runsc is
// still there after a grace period, its process group and every process in
// the cgroup. It returns runsc's state once runsc has been waited for.
func (b *Backend) kill(id string, cmd *exec.Cmd, waited <-chan *os.ProcessState, cg *cgroup.Cgroup) *os.ProcessState {
	if b.runscCmd("kill", id, "KILL") == nil {
		select {
		case ps := <-waited:
			return ps
		case <-time.After(killGrace):
		}
	}
	_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	_ = cg.Kill()
	return <-waited
}

// ensureDead removes the container from runsc if it still knows it, then
// kills whatever is left in the cgroup. A failed `runsc delete` matters only
// if something survives it: cleanup removes runsc's files itself.
func (b *Backend) ensureDead(id string, cg *cgroup.Cgroup) error {
	var derr error
	if b.hasState(id) {
		derr = b.runscCmd("delete", "--force", id)
	}
	if cg != nil {
		if err := cg.Kill(); err != nil {
			return errors.Join(derr, err)
		}
	}
	return nil
}

// cleanup removes everything a run made, whatever state it is in.
func (b *Backend) cleanup(id, bundle string, cg *cgroup.Cgroup) error {
	errs := []error{b.ensureDead(id, cg)}
	if cg != nil {
		errs = append(errs, cg.Remove())
		if unlock, err := state.LockCgroupParent(b.stateDir, true); err == nil {
			cg.RemoveParent() // fails while another run's cgroup is in it
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
// "<id>_sandbox:<id>.state" and its lock, and the sandbox's control socket
// "runsc-<id>.sock", which a sandbox killed early leaves behind.
func (b *Backend) stateFiles(id string) []string {
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		base := strings.TrimSuffix(strings.TrimSuffix(n, ".lock"), ".state")
		if n == id || n == "runsc-"+id+".sock" || base == id || strings.HasSuffix(base, ":"+id) || strings.HasPrefix(base, id+"_") {
			out = append(out, filepath.Join(b.root, n))
		}
	}
	return out
}

// hasState reports whether runsc still has a state file for container id.
func (b *Backend) hasState(id string) bool {
	return slices.ContainsFunc(b.stateFiles(id), func(p string) bool { return strings.HasSuffix(p, ".state") })
}

// runscCmd runs one runsc housekeeping command against the backend's state,
// bounded by killGrace.
func (b *Backend) runscCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), killGrace)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.path, append([]string{"--root", b.root}, args...)...)
	cmd.Env = []string{"PATH=" + spec.DefaultPath}
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
func checkContainer(c *backend.Container) error {
	if c == nil || c.Spec == nil || c.Spec.Linux == nil || c.Spec.Process == nil || c.Spec.Root == nil {
		return errors.New("container spec incomplete")
	}
	if !validID(c.ID) {
		return fmt.Errorf("container id %q must be 1-64 of [a-z0-9-] and not \"root\"", c.ID)
	}
	if !filepath.IsAbs(c.Spec.Root.Path) {
		return fmt.Errorf("root path %q is not absolute", c.Spec.Root.Path)
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

// socketOutputs replaces the stdout and stderr pipes by stream socket
// pairs: gVisor writes to a host pipe without waiting for room, so a
// program's write of more than the pipe's 64 KiB lost the rest; it waits
// on a socket as it should.
func socketOutputs(p *backend.Pipes) error {
	for _, pair := range []struct{ r, w **os.File }{{&p.OutR, &p.OutW}, {&p.ErrR, &p.ErrW}} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("creating output socket pair: %w", err)
		}
		(*pair.r).Close()
		(*pair.w).Close()
		*pair.r, *pair.w = os.NewFile(uintptr(fds[0]), "output-r"), os.NewFile(uintptr(fds[1]), "output-w")
		unix.Shutdown(fds[0], unix.SHUT_WR)
	}
	return nil
}
