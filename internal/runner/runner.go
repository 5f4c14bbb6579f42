package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/uidpool"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/runc"
	"github.com/agentrun/agentrun/runtime/runsc"
	"github.com/agentrun/agentrun/runtime/spec"
)

// Runner runs task plans. It is safe for concurrent use.
type Runner struct {
	cfg         *config.Config
	backends    map[string]backend.Backend // by runtime name
	unavailable map[string]error           // runtimes not installed, and why
	audit       *audit.Log
	runsDir     string
	nets        *netns.Subnets
	store       *image.Store
	regs        *image.Registries // where a task's own image may come from
	own         map[string]bool   // the config's images: not bound by regs
	pool        *Pool             // nil without a pool
	init        string            // the init's copy in BinDir (stageBinary)
	sessions    *session.Store
	uids        *uidpool.Range // each sandbox's own host uid and gid

	// leftovers is what gc cleans with, by runtime name: every backend,
	// and for a runtime not available now, what can still remove its
	// runs that an agentrun which had it left behind.
	leftovers map[string]backend.Leftovers
}

// New prepares a runner from cfg: its state directories and backends.
func New(cfg *config.Config, log *audit.Log) (*Runner, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("agentrun must run as root (it creates namespaces, cgroups and mounts)")
	}
	r := &Runner{cfg: cfg, audit: log, backends: map[string]backend.Backend{}, unavailable: map[string]error{},
		leftovers: map[string]backend.Leftovers{}, runsDir: state.RunsDir(cfg.StateDir)}
	if err := spec.CheckInit(cfg.Init); err != nil {
		return nil, fmt.Errorf("%w (apt-get install tini, or set config key init)", err)
	}
	var err error
	if r.init, err = stageBinary(cfg.Init, "init"); err != nil {
		return nil, fmt.Errorf("the sandbox's init: %w", err)
	}
	if err = os.MkdirAll(r.runsDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	if r.store, err = image.Open(cfg.StoreDir); err != nil {
		return nil, err
	}
	r.store.MaxTotal = cfg.StoreMax.Bytes()
	r.regs = image.NewRegistries(cfg.Policy.Registries)
	r.own = map[string]bool{cfg.Image: true}
	for ref := range cfg.Server.Pool {
		r.own[ref] = true
	}
	if r.sessions, err = session.Open(cfg, spec.UID, spec.GID); err != nil {
		return nil, err
	}
	r.sessions.OnDeadRuns(r.reclaimRuns)
	if r.uids, err = uidpool.Open(cfg.RunUIDs.ReservationsDir(), cfg.RunUIDs.First, cfg.RunUIDs.Count); err != nil {
		return nil, fmt.Errorf("run_uids: %w", err)
	}
	if r.nets, err = netns.NewSubnets(netns.DefaultCIDR); err != nil {
		return nil, err
	}
	lc, err := runc.New(filepath.Join(cfg.StateDir, "runc"))
	if err != nil {
		return nil, err
	}
	lc.SeccompCache = filepath.Join(cfg.StateDir, "seccomp")
	lc.CgroupParent = cfg.CgroupParent
	if lc.SeccompHelper, err = SeccompHelper(cfg); err != nil {
		return nil, err
	}
	if lc.SeccompHelper != "" {
		if lc.SeccompHelper, err = stageBinary(lc.SeccompHelper, runc.SeccompHelper); err != nil {
			return nil, fmt.Errorf("the seccomp helper: %w", err)
		}
	}
	r.backends[config.RuntimeLibcontainer] = lc
	// runsc is optional: a run that asks for it gets the reason it is
	// missing, and gc still removes what runsc runs left behind.
	runscDir := filepath.Join(cfg.StateDir, "runsc")
	if sc, err := runsc.New(cfg.Runsc.Path, cfg.Runsc.Flags, runscDir, cfg.RunscCgroupParent()); err == nil {
		r.backends[config.RuntimeRunsc] = sc
	} else {
		r.unavailable[config.RuntimeRunsc] = err
		r.leftovers[config.RuntimeRunsc] = runsc.Leftovers(runscDir, cfg.RunscCgroupParent())
	}
	for name, be := range r.backends {
		r.leftovers[name] = be
	}
	return r, nil
}

// Sessions is the store of kept session workspaces.
func (r *Runner) Sessions() *session.Store { return r.sessions }

// SeccompHelper is the agentrun-seccomp that config key seccomp_helper
// names: for "" the one beside the binary or in ../lib/agentrun from it
// (runc.FindSeccompHelper), if any; for "off" none; else the path, which
// must pass runc.CheckSeccompHelper. "" means libcontainer compiles the
// filter in every container's init.
func SeccompHelper(cfg *config.Config) (string, error) {
	switch cfg.SeccompHelper {
	case "":
		return runc.FindSeccompHelper(), nil
	case config.SeccompHelperOff:
		return "", nil
	}
	if err := runc.CheckSeccompHelper(cfg.SeccompHelper); err != nil {
		return "", fmt.Errorf("%w (make build puts it in bin/; or set config key seccomp_helper to \"\")", err)
	}
	return cfg.SeccompHelper, nil
}

// PrecompiledSeccomp compiles the sandbox's seccomp filter for
// libcontainer runs, if it is not yet, to be loaded in each sandbox by
// agentrun-seccomp (runtime/runc); when libcontainer compiles it in every
// container's init instead, it says why.
func (r *Runner) PrecompiledSeccomp() error {
	if r.cfg.SeccompHelper == config.SeccompHelperOff {
		return errors.New("config key seccomp_helper is off")
	}
	lc, ok := r.backends[config.RuntimeLibcontainer].(*runc.Backend)
	if !ok {
		return errors.New("no libcontainer backend")
	}
	return lc.PrecompiledSeccomp()
}

// Run runs p, calling hooks as the run goes, and returns its result; it
// never returns nil. A failure of agentrun itself is reported in the
// result's Error (exit status 125). When Run returns, everything the run
// made on the host is gone. It is a runapi.Func, the one the doors get.
func (r *Runner) Run(ctx context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
	// ExitSetup until the program's outcome replaces it: a run whose
	// program never started says so in exit_code too.
	res := &result.Result{ID: newID(), Session: p.Session, Image: p.Image, Runtime: p.Runtime, Files: map[string]result.File{},
		ExitCode: result.ExitSetup}
	res.Network.Allowed, res.Network.Denied, res.Network.Failed = []result.Allowed{}, []result.Denied{}, []result.Failed{}
	rec := &audit.Record{Time: time.Now().UTC(), Session: p.Session, TaskHash: p.TaskHash,
		Image: p.Image, Runtime: p.Runtime, Limits: auditLimits(p)}

	// The audit record is written once, as soon as the result is final:
	// before the door answers from hooks.Result, so that what was
	// answered is on the log even if agentrun dies in the tear-down that
	// follows. A failure of that tear-down is in the result returned,
	// not in the record.
	var written bool
	var auditErr error
	record := func(final *result.Result) {
		if !written {
			written = true
			fillRecord(rec, final)
			if r.audit != nil {
				auditErr = r.audit.Write(rec)
			}
		}
		if auditErr != nil && final.Error == "" {
			final.Error = auditErr.Error()
		}
	}
	inner := hooks
	inner.Result = func(final *result.Result) {
		if final.Err != nil {
			failed(final, rec, final.Err)
		}
		record(final)
		if hooks.Result != nil {
			hooks.Result(final)
		}
	}
	if err := r.runInSandbox(ctx, p, res, inner); err != nil {
		failed(res, rec, err)
	}
	record(res)
	return res
}

// failed sets res's error to err, and rec's detail to what of it stays
// on the host: a registry's words and where it led (an image error's
// result says only its summary).
func failed(res *result.Result, rec *audit.Record, err error) {
	res.Error, res.Err = err.Error(), err
	var ie *image.Error
	if errors.As(err, &ie) {
		if rec.Detail == "" && err.Error() != ie.Summary() {
			fmt.Fprintf(os.Stderr, "agentrun: run %s: %s\n", res.ID, err.Error())
		}
		res.Error, rec.Detail = ie.Summary(), err.Error()
	}
}

// runInSandbox runs p in a sandbox from the pool, or in one set up for it
// now, and tears the sandbox down.
func (r *Runner) runInSandbox(ctx context.Context, p *task.Plan, res *result.Result, hooks runapi.Hooks) (err error) {
	start := time.Now()
	if _, ok := r.backends[p.Runtime]; !ok {
		if err := r.unavailable[p.Runtime]; err != nil {
			return fmt.Errorf("runtime %s is not available: %w", p.Runtime, err)
		}
		return fmt.Errorf("runtime %q is not available", p.Runtime)
	}
	// A kept workspace is held for the whole run: a second run of the
	// session is refused at once.
	var lease *session.Lease
	if p.KeepWorkspace {
		if lease, err = r.sessions.Lock(p.Session); err != nil {
			return err
		}
		defer lease.Release()
	}
	img, err := r.store.Get(ctx, p.Image, r.pullOptions(p))
	if err != nil {
		return err // an *image.Error, which names the image
	}
	defer img.Release() // each sandbox holds it for its own life
	res.ImageDigest = img.Digest

	r.pool.begin()
	defer r.pool.ran(p)
	sb, err := r.sandbox(ctx, p, img, res, lease, approver(hooks.Approve, res))
	if err != nil {
		return cancelled(ctx, err)
	}
	setup := time.Since(start)
	err = r.execute(ctx, p, sb, res, hooks.Output)
	r.pool.ended(sb)
	if sb.pooled && errors.Is(err, backend.ErrNotStarted) && ctx.Err() == nil {
		// The pooled sandbox's init died as the run took it: run cold.
		r.pool.failed(p, fmt.Errorf("running in a pooled sandbox: %w", err))
		if cerr := sb.undo.Clean(); cerr != nil {
			return errors.Join(err, cerr)
		}
		res.ID = newID()
		again := time.Now()
		if sb, err = r.setup(ctx, runRequest(p, img, res, nil, approver(hooks.Approve, res))); err != nil {
			return cancelled(ctx, err)
		}
		setup = time.Since(again)
		err = r.execute(ctx, p, sb, res, hooks.Output)
	}
	if errors.Is(err, backend.ErrNotStarted) {
		err = cancelled(ctx, err)
	}
	// The program has ended: what fills the rest of the result (the
	// network report) runs before anyone sees it.
	if serr := sb.settle.Clean(); serr != nil && err == nil {
		err = fmt.Errorf("cleaning up: %w", serr)
	}
	if hooks.Setup != nil {
		hooks.Setup(sb.pooled, setup)
	}
	answer := func() {
		if hooks.Result != nil {
			final := *res
			if err != nil {
				final.Error, final.Err = err.Error(), err
			}
			hooks.Result(&final)
		}
	}
	// A kept workspace is answered after its disk is unmounted: the
	// client's next run of the session must find it free.
	if lease == nil {
		answer()
	}
	if cerr := sb.undo.Clean(); cerr != nil && err == nil {
		err = fmt.Errorf("cleaning up: %w", cerr)
	}
	if lease != nil {
		lease.Release()
		answer()
	}
	return err
}

// cancelled is err, a failure before the program started (of the set-up,
// or of the program's exec: ErrNotStarted), said as a cancelled run is when
// ctx was cancelled (SIGTERM, a client gone) and that stopped it: the
// backend's Prepare gets ctx. Any other error is err.
func cancelled(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && (errors.Is(err, cerr) || errors.Is(err, backend.ErrNotStarted)) {
		return fmt.Errorf("run cancelled before the program started: %w", cerr)
	}
	return err
}

// approver is the proxy's form of hook for the run whose result is res
// (nil without a hook).
func approver(hook func(context.Context, string, netpolicy.Approval) netpolicy.Decision, res *result.Result) netpolicy.ApproveFunc {
	if hook == nil {
		return nil
	}
	// The id is read when a request is held, once the program runs: a
	// pooled run's is its sandbox's, set after this.
	return func(ctx context.Context, a netpolicy.Approval) netpolicy.Decision { return hook(ctx, res.ID, a) }
}

// pullOptions bounds the pull of a task's image by policy.registries,
// unless the config names that image itself.
func (r *Runner) pullOptions(p *task.Plan) image.PullOptions {
	if r.own[p.Image] {
		return image.PullOptions{}
	}
	return image.PullOptions{Registries: r.regs}
}

// sandbox is a ready sandbox from the pool with p's files written in, or
// else one set up for p now (always for a kept workspace, whose disk the
// pool's sandboxes lack). It sets res.ID to the sandbox's.
func (r *Runner) sandbox(ctx context.Context, p *task.Plan, img *image.Image, res *result.Result, lease *session.Lease, approve netpolicy.ApproveFunc) (*sandbox, error) {
	if lease != nil {
		return r.setup(ctx, runRequest(p, img, res, lease, approve))
	}
	// A pooled sandbox's proxy has denied everything since it was made: it
	// gets this run's policy, and no other, as the run takes it.
	claim := func(sb *sandbox) error {
		if sb.proxy == nil {
			return nil
		}
		return r.bindNetwork(sb, p, approve, res)
	}
	if sb := r.pool.take(p, img, claim); sb != nil {
		res.ID = sb.id
		if err := sb.ws.Write(runFiles(p), sb.uid, sb.uid); err != nil {
			r.pool.ended(sb)
			return nil, errors.Join(err, sb.undo.Clean())
		}
		return sb, nil
	}
	return r.setup(ctx, runRequest(p, img, res, nil, approve))
}

// execute runs the program of sb to its end and collects its files.
func (r *Runner) execute(ctx context.Context, p *task.Plan, sb *sandbox, res *result.Result, output runapi.OutputFunc) (err error) {
	out, err := sb.prep.Exec(ctx, backend.Program{Stdin: p.Stdin, Timeout: p.Limits.Timeout, OutputLimit: p.Limits.OutputBytes, Output: backend.OutputFunc(output)})
	if out != nil {
		fillOutcome(res, out)
	}
	if err != nil {
		return err
	}
	readValues(sb.display, p.Limits.OutputBytes, res)
	if p.KeepState {
		res.State = readState(sb.display)
	}
	if len(p.Collect) > 0 {
		if res.Files, res.Collect, err = sb.ws.Collect(p.Collect, workspace.Limits{}); err != nil {
			return err
		}
	}
	return nil
}

// sandbox is one run's host-side set-up (its state dir and lock, rootfs,
// network and workspace) and its prepared container. undo removes all of
// it.
type sandbox struct {
	id     string
	pooled bool // taken from the pool
	// refill, while not nil, is the pool's shape whose replacement of
	// this sandbox waits for the end of its program (Pool.ended).
	refill *shape
	uid    int // the host uid and gid its processes run as: its own
	ws     *workspace.Workspace
	// display is the host path of its display directory, where a Python
	// run's values are shown (values.go); "" without one.
	display string
	spec    *specs.Spec
	proxy   *proxy.Proxy // its egress proxy, nil without network
	prep    backend.Prepared
	undo    cleanup.Cleanup
	// settle ends what the run used once its program has ended and fills
	// the result with what it recorded (the proxy's report); it runs
	// before the result is final.
	settle cleanup.Cleanup
}

// request is what setup makes one sandbox for: a run's, or one made
// ahead for the pool, which no run has yet.
type request struct {
	plan *task.Plan
	img  *image.Image
	id   string // the sandbox's, which is its run's
	// files are written into its workspace.
	files map[string][]byte
	// lease, if not nil, is the kept session whose disk is the workspace,
	// mounted in the run dir (so that gc finds it there if agentrun dies).
	lease *session.Lease
	// pooled: the sandbox is made ahead for the pool. Its network, if any,
	// waits for the policy of the run that takes it (bindNetwork), and res
	// and approve are not used.
	pooled bool
	// res is the run's result, which the network's report fills once the
	// program has ended; approve decides its held requests (nil: denied).
	res     *result.Result
	approve netpolicy.ApproveFunc
	// warm, if not nil, is the launcher argv of a warm sandbox (warm.go):
	// its program is the launcher, started by setup, which returns once it
	// is ready. Only the pool makes warm sandboxes.
	warm []string
}

// runRequest is the request for the sandbox of a run of p that sets its
// own up, under its result's id, with its files.
func runRequest(p *task.Plan, img *image.Image, res *result.Result, lease *session.Lease, approve netpolicy.ApproveFunc) request {
	return request{plan: p, img: img, id: res.ID, files: runFiles(p), lease: lease, res: res, approve: approve}
}

// poolRequest is the request for a sandbox made ahead for the pool for
// plans of p's shape, with no files; warm as in request.
func poolRequest(p *task.Plan, img *image.Image, warm []string) request {
	return request{plan: p, img: img, id: newID(), pooled: true, warm: warm}
}

// setup makes the sandbox that req asks for. It is the setup order of one
// run: every step that makes something on the host pushes its undo, and
// on error everything made is undone. ctx is the run's (Background for
// the pool's): once it is cancelled, the backend's Prepare stops. A
// *warmError is the failure of a warm sandbox's launcher.
func (r *Runner) setup(ctx context.Context, req request) (_ *sandbox, err error) {
	if req.pooled == (req.res != nil) {
		return nil, errors.New("a sandbox is set up for a run, with its result, or for the pool, without one")
	}
	p, img, id, lease := req.plan, req.img, req.id, req.lease
	be := r.backends[p.Runtime]
	if be == nil {
		return nil, fmt.Errorf("runtime %q is not available", p.Runtime)
	}
	traits := be.Traits()
	sb := &sandbox{id: id}
	defer func() {
		if err != nil {
			if cerr := sb.undo.Clean(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
			}
		}
	}()

	dir, lock, err := r.register(id)
	if err != nil {
		return nil, err
	}
	sb.undo.Add(lock.Close) // last: the run is live until everything else is gone
	sb.undo.Add(func() error { return os.RemoveAll(dir) })

	// Its own uid and gid, so that no other run shares its per-user
	// kernel limits; given back once all else is gone but the run dir,
	// whose lock keeps gc off it until then.
	// The reservation names the run dir: its state dir's gc is the one
	// that may reclaim it.
	uid, err := r.uids.Take(dir)
	if err != nil {
		return nil, fmt.Errorf("run_uids: %w", err)
	}
	sb.uid = int(uid)
	sb.undo.Add(func() error { return r.uids.Free(uid, dir) })

	// The image stays in the store while the sandbox lives (a pooled one
	// outlives the Get that found its image).
	release, err := r.store.Hold(img)
	if err != nil {
		return nil, err
	}
	sb.undo.Add(release)

	rootfs := img.Rootfs
	// A store image has its mount points; a dir: image may lack them, and
	// then the run gets a private overlay so that nothing is created in it.
	// So does every run of a backend that writes to its rootfs (runsc's
	// gofer makes the init's mount point, /dev/init, in the root
	// filesystem itself, not in the sandbox's /dev). A run with services gets one too,
	// for the mount points of its CA.
	if !image.HasMountpoints(rootfs) || traits.PrivateRootfs || len(p.Services) > 0 {
		ov, err := mountOverlay(img.Rootfs, dir)
		if err != nil {
			return nil, err
		}
		sb.undo.Add(ov.unmount)
		rootfs = ov.merged
	}

	if err := checkProgram(rootfs, p.Argv[0]); err != nil {
		return nil, err
	}
	netOpts, err := r.network(req, rootfs, dir, sb)
	if err != nil {
		return nil, err
	}

	wsSize := p.Limits.WorkspaceSize
	if lease != nil {
		wsSize = r.sessions.MaxBytes()
		wsDir := filepath.Join(dir, "workspace")
		if err := lease.Mount(wsDir); err != nil {
			return nil, err
		}
		// The disk keeps one owner, the sandbox user of the store, which
		// the run sees as its own uid through an id-mapped mount.
		if sb.ws, err = workspace.Adopt(wsDir, spec.UID, spec.GID, req.files); err != nil {
			return nil, err
		}
		sb.undo.Add(sb.ws.Close)
		if err := uidpool.Remap(wsDir, spec.UID, uid); err != nil {
			return nil, err
		}
	} else if sb.ws, err = workspace.Create(filepath.Join(dir, "workspace"), p.Limits.WorkspaceSize, sb.uid, sb.uid, req.files); err != nil {
		return nil, err
	} else {
		sb.undo.Add(sb.ws.Close)
	}

	idOpts, err := identity(rootfs, dir, sb.uid, &sb.undo)
	if err != nil {
		return nil, err
	}
	opts := append(SandboxSpec(p, traits.CgroupParent+"/"+id, r.init, sb.ws.Dir, wsSize), netOpts...)
	opts = append(opts, idOpts...)
	if traits.Spec != nil {
		opts = append(opts, traits.Spec)
	}
	if argv := launcherArgv(p); argv != nil || req.warm != nil {
		valueOpts, display, err := values(dir, sb.uid, newStateRequest(p, r.cfg), &sb.undo)
		if err != nil {
			return nil, err
		}
		opts = append(opts, valueOpts...)
		if argv != nil {
			opts = append(opts, spec.WithArgs(argv...))
		}
		sb.display = display
	}
	var handover *backend.Handover
	if req.warm != nil {
		// From the run's etc tmpfs, as the identity files: the
		// sandbox's mountinfo names no host path.
		path, err := writeEtc(dir, &sb.undo, launcherName, launcher)
		if err != nil {
			return nil, fmt.Errorf("writing the warm launcher: %w", err)
		}
		if handover, err = backend.NewHandover(); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				handover.Close() // Prepare closes it on its own errors
			}
		}()
		opts = append(opts, spec.WithArgs(req.warm...), spec.WithReadonlyFile(path, LauncherPath))
	}
	if sb.spec, err = spec.New(rootfs, opts...); err != nil {
		return nil, fmt.Errorf("building spec: %w", err)
	}
	sb.spec.Process.User = specs.User{UID: uid, GID: uid}
	if err := spec.Validate(sb.spec); err != nil {
		return nil, fmt.Errorf("spec refused: %w", err)
	}

	if sb.prep, err = be.Prepare(ctx, &backend.Container{ID: id, Spec: sb.spec, Handover: handover}); err != nil {
		return nil, err
	}
	sb.undo.Add(sb.prep.Destroy)
	if handover != nil {
		if err := handover.Ready(warmReadyWait); err != nil {
			return nil, &warmError{err}
		}
	}
	return sb, nil
}

// SandboxSpec is what p's sandbox spec is made of, besides its network
// and its identity files: what of the plan it uses is what makes a pooled
// sandbox's shape (shapeKey), and a test holds the two together. The bench
// builds runc's bundle from it, so that runc runs the same spec.
func SandboxSpec(p *task.Plan, cgroup, init, wsDir string, wsSize int64) []spec.SpecOpt {
	return []spec.SpecOpt{
		spec.WithArgs(p.Argv...),
		spec.WithEnv(p.Env),
		spec.WithCgroupsPath(cgroup),
		spec.WithMemory(p.Limits.Memory),
		spec.WithCPUs(p.Limits.CPUs),
		spec.WithPids(p.Limits.Pids + 1), // the init is one of them
		spec.WithInit(init),
		spec.WithTmpSize(p.Limits.TmpSize, wsSize),
		spec.WithWorkspace(wsDir),
		spec.WithSeccomp(),
	}
}

// runFiles is the workspace content of p: its files and its code file.
func runFiles(p *task.Plan) map[string][]byte {
	if p.CodeFile == "" {
		return p.Files
	}
	files := make(map[string][]byte, len(p.Files)+1)
	for k, v := range p.Files {
		files[k] = v
	}
	files[p.CodeFile] = p.Code
	return files
}

func fillOutcome(res *result.Result, o *backend.Outcome) {
	res.ExitCode, res.Signal = o.ExitCode, o.Signal
	res.TimedOut, res.OOMKilled = o.TimedOut, o.OOMKilled
	res.SetOutput(o.Stdout.Data, o.Stderr.Data)
	res.StdoutTruncated, res.StderrTruncated = o.Stdout.Truncated, o.Stderr.Truncated
	res.StdoutBytes, res.StderrBytes = o.Stdout.Total, o.Stderr.Total
	res.DurationMS = o.Duration.Milliseconds()
	res.CPUMS = o.CPU.Milliseconds()
	res.MemoryPeakBytes = o.MemoryPeak
}

func fillRecord(rec *audit.Record, res *result.Result) {
	rec.ID = res.ID
	rec.ImageDigest = res.ImageDigest
	rec.Network = res.Network
	rec.ExitCode, rec.Signal, rec.TimedOut, rec.OOMKilled = res.ExitCode, res.Signal, res.TimedOut, res.OOMKilled
	rec.DurationMS, rec.CPUMS, rec.MemoryPeakBytes = res.DurationMS, res.CPUMS, res.MemoryPeakBytes
	rec.StdoutBytes, rec.StderrBytes = res.StdoutBytes, res.StderrBytes
	for name := range res.Files {
		rec.Files = append(rec.Files, name)
	}
	rec.Error = res.Error
}

// auditLimits are p's limits as the audit record lists them: every limit
// under its name (a duration in milliseconds, under its name and "_ms"),
// and the network the run was allowed.
func auditLimits(p *task.Plan) audit.Limits {
	values := make(map[string]float64, len(config.LimitTable))
	for _, lim := range config.LimitTable {
		values[lim.AuditKey] = lim.Audit(p.Limits)
	}
	return audit.Limits{Values: values, NetworkAllow: p.Allow, NetworkServices: p.Services}
}

// newID returns a fresh run id, "ar-" and 16 hex digits.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ar-" + hex.EncodeToString(b[:])
}
