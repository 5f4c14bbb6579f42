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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/cgroup"
	"github.com/agentrun/agentrun/runtime/spec"
)

// killGrace bounds how long the backend waits for a killed sandbox to end,
// and for one runsc housekeeping command.
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
	parent   string // the cgroup that holds the runs' cgroups
}

// New returns a backend running the runsc binary at path with the extra
// global flags, keeping bundles and runsc's state under stateDir, and the
// runs' cgroups under cgroupParent ("" for CgroupParent). It makes
// the calling process the reaper of its orphaned descendants
// (PR_SET_CHILD_SUBREAPER): the sandboxes it creates.
func New(path string, flags []string, stateDir, cgroupParent string) (*Backend, error) {
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
	// A sandbox outlives the runsc create that made it; agentrun becomes
	// its parent, so that it reaps it and has the program's exit status
	// from it (runsc boot exits with it) without another runsc command.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("becoming the reaper of runsc's sandboxes: %w", err)
	}
	b := &Backend{path: path, flags: slices.Clone(flags), stateDir: stateDir, root: filepath.Join(stateDir, "root"), parent: cgroupParent}
	if err := os.MkdirAll(b.root, 0o700); err != nil {
		return nil, fmt.Errorf("creating runsc state dir: %w", err)
	}
	return b, nil
}

// Traits: runsc's gofer writes the mount points it needs into the root
// filesystem, so a run needs its own; the backend changes the spec
// (SpecOpt); a prepared sandbox waits, booted, for `runsc start`, so it can
// be pooled; outputs are sockets (Pipes.SocketOutputs).
func (b *Backend) Traits() backend.Traits {
	return backend.Traits{CgroupParent: b.cgroupParent(), PrivateRootfs: true, Poolable: true, SocketOutputs: true, Spec: SpecOpt()}
}

func (b *Backend) cgroupParent() string {
	if b.parent != "" {
		return b.parent
	}
	return CgroupParent
}

// createWait bounds `runsc create`, which boots the sandbox: a few hundred
// milliseconds, seconds on a busy host.
const createWait = 60 * time.Second

// startWait bounds `runsc start`, which takes milliseconds when the sandbox
// waits for it. A sandbox that cannot take it (stopped, say) would
// otherwise hold the run.
const startWait = 5 * time.Second

// prepared is a sandbox booted by `runsc create` in its own cgroup, with its
// container created and its stdio wired, whose program waits for `runsc
// start`. Its program runs once, by Exec; Destroy removes it, run or not.
type prepared struct {
	b      *Backend
	id     string
	bundle string
	global []string // runsc's global flags for this sandbox
	cg     *cgroup.Cgroup
	stdio  *backend.Pipes
	// The sandbox process (runsc boot), agentrun's child once runsc
	// create has ended: its pid, and a pidfd, -1 when none.
	pid, pidfd int
	// groups are the process groups of the sandbox's processes (the
	// sandbox's, the gofer's and their helpers'), whose members all come
	// to agentrun once killed, for Destroy to reap.
	groups []int
	ran    bool
	// proc is the container's process, whose environment, working
	// directory, user and rlimits a process Spawn starts shares.
	proc *specs.Process
	// started is closed once Exec's `runsc start` has ended, startErr
	// its error: Spawn waits for it.
	started   chan struct{}
	startOnce sync.Once
	startErr  error
	// live are the `runsc exec` commands of the processes Spawn started
	// that have not ended, which Destroy kills.
	live liveExecs
}

// Prepare writes c's bundle and cgroup and creates its sandbox with `runsc
// create`, whose stdio the program gets; once ctx is done, runsc create is
// stopped. On error nothing is left behind.
func (b *Backend) Prepare(ctx context.Context, c *backend.Container) (_ backend.Prepared, err error) {
	if err := checkContainer(c); err != nil {
		return nil, err
	}
	cgPath := c.Spec.Linux.CgroupsPath
	if cgPath == "" {
		cgPath = b.cgroupParent() + "/" + c.ID
	}
	if !filepath.IsAbs(cgPath) || filepath.Clean(cgPath) != cgPath || cgPath == "/" {
		return nil, fmt.Errorf("cgroups path %q must be absolute and clean", cgPath)
	}
	bundle := filepath.Join(b.stateDir, c.ID)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return nil, fmt.Errorf("creating bundle dir: %w", err)
	}
	p := &prepared{b: b, id: c.ID, bundle: bundle, global: b.globalArgs(c, bundle), pidfd: -1, proc: c.Spec.Process, started: make(chan struct{})}
	defer func() {
		if err != nil {
			if derr := p.Destroy(); derr != nil {
				err = errors.Join(err, fmt.Errorf("cleaning up: %w", derr))
			}
		}
	}()
	if err := writeConfig(bundle, c.Spec, cgPath); err != nil {
		return nil, err
	}

	unlock, err := state.LockCgroupParent(b.stateDir, false)
	if err != nil {
		return nil, err
	}
	p.cg, err = cgroup.New(cgPath, c.Spec.Linux.Resources)
	unlock()
	if err != nil {
		return nil, err
	}

	if p.stdio, err = backend.NewPipes(); err != nil {
		return nil, err
	}
	if err := p.stdio.SocketOutputs(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, createWait)
	defer cancel()
	pidFile := filepath.Join(bundle, "sandbox.pid")
	// Cancelled, runsc create is stopped and every process it started is
	// killed with their process groups known, before any of them can exit
	// unknown and be left to agentrun unreaped (the sandbox, say, which
	// exits when runsc create dies).
	stopped := func(create int) {
		p.groups = groupsOf(withChildren([]int{create}), p.groups)
		_ = p.killAll()
	}
	_, err = b.commandStopping(ctx, p.stdio, stopped, p.global, "create", "--bundle", bundle, "--pid-file", pidFile, c.ID)
	// Whatever runsc create left in the cgroup is agentrun's now.
	p.groups = groupsOf(withChildren(p.cg.Pids()), p.groups)
	if err != nil {
		return nil, p.failed("creating the sandbox", err)
	}
	p.stdio.CloseChildEnds()
	if p.pid, p.pidfd, err = openSandbox(pidFile, p.cg); err != nil {
		return nil, err
	}
	return p, nil
}

// openSandbox returns the pid of the sandbox process that `runsc create`
// wrote to pidFile, and a pidfd of it, once it is seen in the sandbox's
// cgroup (not another process that took a dead sandbox's pid).
func openSandbox(pidFile string, cg *cgroup.Cgroup) (int, int, error) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, -1, fmt.Errorf("reading the sandbox's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, -1, fmt.Errorf("runsc wrote sandbox pid %q", b)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, -1, fmt.Errorf("opening the sandbox process %d: %w", pid, err)
	}
	if !slices.Contains(cg.Pids(), pid) {
		unix.Close(fd)
		return 0, -1, fmt.Errorf("sandbox process %d is gone from cgroup %s", pid, cg.Path())
	}
	return pid, fd, nil
}

// groupsOf adds to groups the process group of each of pids still there,
// but agentrun's own.
func groupsOf(pids []int, groups []int) []int {
	own := unix.Getpgrp()
	for _, pid := range pids {
		if g, err := unix.Getpgid(pid); err == nil && g != own && !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	return groups
}

// withChildren is pids and the children of each (zombies included).
func withChildren(pids []int) []int {
	all := slices.Clone(pids)
	for _, pid := range pids {
		files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			for field := range strings.FieldsSeq(string(b)) {
				if kid, err := strconv.Atoi(field); err == nil {
					all = append(all, kid)
				}
			}
		}
	}
	return all
}

// reapGroups kills whatever is left of the process groups groups, made by
// runsc, and reaps their processes as they come to agentrun, until every
// group is gone or killGrace has passed. A killed process whose parent
// is killed too is agentrun's once its parent has exited (New made
// agentrun the reaper of orphans); dead, it is in no cgroup any more,
// and its process group is what is left to find it by. Waiting for the
// group's id reaps no other child of agentrun: the id is not reused
// while any process, zombie or not, is in the group, and the waits stop
// once it is empty.
func reapGroups(groups []int) error {
	deadline := time.Now().Add(killGrace)
	for _, g := range groups {
		for {
			if unix.Kill(-g, unix.SIGKILL) == unix.ESRCH {
				break // all reaped
			}
			for {
				var ws unix.WaitStatus
				if pid, err := unix.Wait4(-g, &ws, unix.WNOHANG, nil); pid <= 0 && err != unix.EINTR {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("runsc's process group %d did not end", g)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// alive reports whether the sandbox process has not exited.
func (p *prepared) alive() bool { return !backend.Exited(p.pidfd) }

// Ready reports whether the sandbox still waits for its program's start.
func (p *prepared) Ready() bool { return !p.ran && p.alive() }

// exit is how the program ended: the sandbox process's exit status, which
// is the program's (128+n for a program that signal n ended, as runsc
// reports it), or SIGKILL's when the sandbox itself was killed.
type exit struct {
	status int
	err    error // no status: the sandbox could not be waited for
}

// Exec starts the program (`runsc start`), feeds it stdin and waits for the
// sandbox, which ends with the program, to end or for the timeout (or ctx)
// to kill it; output, if not nil, gets the kept output as it arrives. The
// timeout runs from the start on, as with libcontainer, whose exec is
// bounded apart; so is the start, by startWait. It may be called once.
func (p *prepared) Exec(ctx context.Context, prog backend.Program) (*backend.Outcome, error) {
	stdin, timeout, outputLimit, output := prog.Stdin, prog.Timeout, prog.OutputLimit, prog.Output
	if p.ran {
		return nil, errors.New("container already ran")
	}
	p.ran = true
	if timeout <= 0 {
		err := fmt.Errorf("timeout %v is not positive", timeout)
		p.markStarted(err)
		return nil, err
	}
	wasReady := p.alive()
	out := &backend.Outcome{}
	waitOutput := p.stdio.Serve(stdin, outputLimit, output)
	ended := make(chan exit, 1)
	go func() { ended <- p.wait() }()
	// Usage counts from here: the program's, not the sandbox's boot.
	p.cg.Start()
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, startWait)
	_, err := p.b.command(sctx, nil, p.global, "start", p.id)
	cancel()
	p.markStarted(err)
	if err != nil {
		// The pipes reach EOF once the sandbox is gone.
		kerr := p.killAll()
		waitOutput()
		// runsc's stderr is not the program's (no such program, say),
		// so no outcome is returned, as with libcontainer.
		ferr := p.failed("starting the program", err)
		if !wasReady || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			ferr = fmt.Errorf("%w: %w", backend.ErrNotStarted, ferr)
		}
		return nil, errors.Join(ferr, kerr)
	}

	ex, timedOut := backend.Watch(ctx, timeout, ended, func() exit { return p.kill(ended) })
	out.Duration = time.Since(start)

	// The sandbox has ended; so must its gofer, so that both outputs reach
	// EOF and the cgroup's figures are final.
	dead := p.killAll()
	out.Stdout, out.Stderr = waitOutput()
	out.SetStatus(ex.status, timedOut)
	u := p.cg.Usage()
	out.CPU, out.MemoryPeak, out.OOMKilled = u.CPU, u.MemoryPeak, u.OOMKilled
	if dead != nil {
		return out, dead
	}
	if ex.err != nil {
		return out, fmt.Errorf("waiting for the sandbox: %w", ex.err)
	}
	if ctx.Err() != nil {
		return out, fmt.Errorf("run cancelled: %w", ctx.Err())
	}
	return out, nil
}

// markStarted records the end of the program's start, err its error.
func (p *prepared) markStarted(err error) {
	p.startOnce.Do(func() {
		p.startErr = err
		close(p.started)
	})
}

// wait reaps the sandbox process, agentrun's child (New made agentrun the
// reaper of what runsc create leaves), and returns its exit status.
func (p *prepared) wait() exit {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(p.pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return exit{err: fmt.Errorf("waiting for sandbox process %d: %w", p.pid, err)}
		}
		break
	}
	if ws.Signaled() {
		return exit{status: 128 + int(ws.Signal())}
	}
	return exit{status: ws.ExitStatus()}
}

// kill ends a run that must stop now: every process in the cgroup (the
// sandbox and its gofer) is killed. It returns once the sandbox has been
// reaped, or after killGrace (the kill failed; Exec reports that) with
// SIGKILL's status, as a program that the kill ended reads.
func (p *prepared) kill(ended <-chan exit) exit {
	// A live sandbox's processes first: each `runsc exec` killed reads
	// as its process killed, which it is with the sandbox a moment
	// later (after the sandbox, it would fail waiting for it).
	p.live.killAll()
	_ = p.killAll()
	select {
	case ex := <-ended:
		return ex
	case <-time.After(killGrace):
		return exit{status: 128 + int(unix.SIGKILL)}
	}
}

// killAll kills every process in the sandbox's cgroup, adding the process
// groups of those it kills, and of their children, to p.groups for
// Destroy to reap: the freeze of the kill holds them still while they are
// listed.
func (p *prepared) killAll() error {
	return p.cg.KillSeen(func(pids []int) { p.groups = groupsOf(withChildren(pids), p.groups) })
}

// failed is err, what runsc failed at, with the first error runsc logged
// if there is one.
func (p *prepared) failed(what string, err error) error {
	if msg := runscError(filepath.Join(p.bundle, "runsc.log")); msg != "" {
		return fmt.Errorf("runsc failed %s: %s", what, msg)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Destroy kills whatever is left of the sandbox and removes it: its
// processes, cgroup, bundle, runsc's state and the pipes.
func (p *prepared) Destroy() error {
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
	if p.stdio != nil {
		p.stdio.CloseAll()
	}
	// Killed first, so that runsc delete, which kills the sandbox, leaves
	// no process whose group is not known; cleanup's own kill reports
	// any that survive.
	if p.cg != nil {
		_ = p.killAll()
	}
	p.live.killAll()
	err := p.b.cleanup(p.id, p.bundle, p.cg)
	// Killed, they are agentrun's zombies until reaped.
	rerr := reapGroups(p.groups)
	p.groups = nil
	return errors.Join(err, rerr)
}

// globalArgs are runsc's global flags for the sandbox of c, whose bundle
// is bundle; every runsc command on it gets the same.
func (b *Backend) globalArgs(c *backend.Container, bundle string) []string {
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
	return append(args, b.flags...)
}

// ensureDead removes the container from runsc if it still knows it, then
// kills whatever is left in the cgroup. A failed `runsc delete` matters only
// if something survives it: cleanup removes runsc's files itself.
func (b *Backend) ensureDead(id string, cg *cgroup.Cgroup) error {
	var derr error
	// Without a runsc binary (Leftovers), the cgroup's kill ends it all.
	if b.path != "" && b.hasState(id) {
		ctx, cancel := context.WithTimeout(context.Background(), killGrace)
		_, derr = b.command(ctx, nil, []string{"--root", b.root}, "delete", "--force", id)
		cancel()
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
		errs = append(errs, cg.Remove()) // the shared parent stays (RemoveCgroupParent)
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

// commandOutput caps what is kept of a runsc command's stdout and stderr.
const commandOutput = 64 << 10

// command runs runsc with the global flags global, then args, to its end
// or until ctx is done, when its process group is killed; it returns its
// stdout. With stdio, the command's stdio are the program's ends (runsc
// create passes its own to the sandbox); without, its output is kept, up
// to commandOutput. It runs in its own process group, and is killed with
// agentrun: an agentrun that dies leaves no runsc command going on to
// write state after gc has looked. Whatever is left in its group when it
// ends (a child a cancelled runsc create had started) is killed and
// reaped. The parent-death signal follows the
// thread that started the command, not the process: the thread is kept,
// alive, until the command has been waited for.
func (b *Backend) command(ctx context.Context, stdio *backend.Pipes, global []string, args ...string) ([]byte, error) {
	return b.commandStopping(ctx, stdio, nil, global, args...)
}

// commandStopping is command, stopping the command's process group (SIGSTOP)
// when ctx is done and calling stopped, if not nil, with the command's pid
// before the kill.
func (b *Backend) commandStopping(ctx context.Context, stdio *backend.Pipes, stopped func(pid int), global []string, args ...string) ([]byte, error) {
	cmd := exec.Command(b.path, append(slices.Clip(global), args...)...)
	cmd.Env = []string{"PATH=" + spec.DefaultPath}
	stdout, stderr := &backend.CappedBuffer{Max: commandOutput}, &backend.CappedBuffer{Max: commandOutput}
	if stdio != nil {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.InR, stdio.OutW, stdio.ErrW
	} else {
		cmd.Stdout, cmd.Stderr = stdout, stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A grandchild that holds the output pipe does not hold Wait.
	cmd.WaitDelay = killGrace
	started, done := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting runsc %s: %w", args[0], err)
	}
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		if stopped != nil {
			_ = unix.Kill(-cmd.Process.Pid, unix.SIGSTOP)
			stopped(cmd.Process.Pid)
		}
		_ = unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		<-done
		err = ctx.Err()
	}
	// What the command started in its group and left (killed above, a
	// child it had not yet waited for) is agentrun's to reap.
	if rerr := reapGroups([]int{cmd.Process.Pid}); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return stdout.Bytes(), fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
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
