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
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/toolbroker"
	"github.com/agentrun/agentrun/internal/uidpool"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
)

// Runner runs task plans. It is safe for concurrent use.
type Runner struct {
	// cfg is the config the runner started with. Only the keys a reload
	// of serve cannot change (config.ReloadTable's restart-only ones) are
	// read from it; what a run takes of the others (its tool servers,
	// tool_limits, whether its image is the config's own) comes with its
	// plan, resolved under the config that admitted it.
	cfg         *config.Config
	backends    map[string]backend.Backend // by runtime name
	unavailable map[string]error           // runtimes not installed, and why
	audit       *audit.Log
	runsDir     string
	nets        *netns.Subnets
	store       *image.Store
	regs        *image.Registries // where a task's own image may come from
	pool        *Pool             // nil without a pool
	init        string            // the init's copy in BinDir (StageBinary)
	sessions    *session.Store
	uids        *uidpool.Range // each sandbox's own host uid and gid
	// sharedTools holds the tool servers the config marks shared, for
	// the runner's lifetime (their processes die with agentrun).
	sharedTools *toolbroker.Shared
	// codes is the run launcher's bytecode by image and interpreter.
	codes *launcher.Codes

	// Logf, when set, gets what the result does not say: a registry's
	// words behind an image error's summary. Set it before the first run.
	Logf func(format string, args ...any)

	// leftovers is what gc cleans with, by runtime name: every backend,
	// and for a runtime not available now, what can still remove its
	// runs that an agentrun which had it left behind.
	leftovers map[string]backend.Leftovers
}

// ErrNotRoot is New's error, and the composition's (internal/compose),
// when agentrun does not run as root.
var ErrNotRoot = errors.New("agentrun must run as root (it creates namespaces, cgroups and mounts)")

// New prepares a runner from cfg: its state directories, with the
// runtimes it is handed (internal/compose chooses them), by name: a run
// that asks for one whose Backend is nil gets the reason it is missing,
// and gc still removes what its runs left behind.
func New(cfg *config.Config, log *audit.Log, runtimes ...backend.Runtime) (*Runner, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	// Every sandbox's spec has the filter: made beside the checks below
	// and, for a one-shot run, the task's own set-up.
	go spec.WarmSeccomp()
	r := &Runner{cfg: cfg, audit: log, backends: map[string]backend.Backend{}, unavailable: map[string]error{},
		leftovers: map[string]backend.Leftovers{}, runsDir: state.RunsDir(cfg.StateDir), sharedTools: &toolbroker.Shared{Dir: toolsDir(cfg)}}
	r.codes = launcher.NewCodes(filepath.Join(cfg.StateDir, "launcher"), r.compileLauncher, r.logf)
	if err := spec.CheckInit(cfg.Init); err != nil {
		return nil, fmt.Errorf("%w (apt-get install tini, or set config key init)", err)
	}
	var err error
	if r.init, err = StageBinary(cfg.Init, "init"); err != nil {
		return nil, fmt.Errorf("the sandbox's init: %w", err)
	}
	for _, dir := range []string{r.runsDir, toolsDir(cfg)} {
		if err = os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("creating state dir: %w", err)
		}
	}
	if r.store, err = image.Open(cfg.StoreDir); err != nil {
		return nil, err
	}
	r.store.MaxTotal = cfg.StoreMax.Bytes()
	r.regs = image.NewRegistries(cfg.Policy.Registries, hostaddr.Own)
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
	for _, rt := range runtimes {
		switch {
		case rt.Backend != nil:
			r.backends[rt.Name], r.leftovers[rt.Name] = rt.Backend, rt.Backend
		case rt.Leftovers != nil:
			r.unavailable[rt.Name], r.leftovers[rt.Name] = rt.Missing, rt.Leftovers
		default:
			r.unavailable[rt.Name] = rt.Missing
		}
	}
	return r, nil
}

// Sessions is the store of kept session workspaces.
func (r *Runner) Sessions() *session.Store { return r.sessions }

// Close stops what the runner keeps between runs: the tool servers the
// config marks shared (and their cgroups). Call it once no run is in
// progress; a run after it gets no shared server.
func (r *Runner) Close() error {
	r.codes.Close()
	if err := r.sharedTools.Close(); err != nil {
		return fmt.Errorf("stopping the shared tool servers: %w", err)
	}
	return nil
}

// PrecompiledSeccomp compiles the sandbox's seccomp filter for
// libcontainer runs, if it is not yet, to be loaded in each sandbox by
// agentrun-seccomp (runtime/runc); when libcontainer compiles it in every
// container's init instead, it says why.
func (r *Runner) PrecompiledSeccomp() error {
	if r.cfg.SeccompHelper == config.SeccompHelperOff {
		return errors.New("config key seccomp_helper is off")
	}
	lc, ok := r.backends[config.RuntimeLibcontainer].(interface{ PrecompiledSeccomp() error })
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
	if p.Offline() {
		// No proxy's report replaces it: the result says the run had no
		// network, which no record of the program's lookups can.
		res.Network = result.NoNetwork()
	}
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
		final.Settle()
		if !written {
			written = true
			fillRecord(rec, final)
			if r.audit != nil {
				auditErr = r.audit.Write(rec)
			}
		}
		if auditErr != nil && final.Error == "" {
			final.Error = auditErr.Error()
			final.Settle()
		}
	}
	inner := hooks
	inner.Result = func(final *result.Result) {
		if final.Err != nil {
			r.failed(final, rec, final.Err)
		}
		record(final)
		if hooks.Result != nil {
			hooks.Result(final)
		}
	}
	if err := r.runInSandbox(ctx, p, res, inner); err != nil {
		r.failed(res, rec, err)
	}
	record(res)
	return res
}

// failed sets res's error to err, and rec's detail to what of it stays
// on the host: a registry's words and where it led (an image error's
// result says only its summary), which Logf gets too.
func (r *Runner) failed(res *result.Result, rec *audit.Record, err error) {
	res.Error, res.Err = err.Error(), err
	var ie *image.Error
	if errors.As(err, &ie) {
		if rec.Detail == "" && err.Error() != ie.Summary() && r.Logf != nil {
			r.Logf("run %s: %s", res.ID, err.Error())
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
	req := runRequest(p, img, res, lease, approver(hooks.Approve, res))
	req.toolCount = hooks.ToolCalled
	sb, err := r.sandbox(ctx, req)
	if err != nil {
		return cancelled(ctx, err)
	}
	setup := time.Since(start)
	err = r.execute(ctx, p, sb, res, hooks)
	r.pool.ended(sb)
	if sb.pooled && errors.Is(err, backend.ErrNotStarted) && ctx.Err() == nil {
		// The pooled sandbox's init died as the run took it: run cold.
		r.pool.failed(p, fmt.Errorf("running in a pooled sandbox: %w", err))
		if cerr := sb.undo.Clean(); cerr != nil {
			return errors.Join(err, cerr)
		}
		res.ID = newID()
		req.id = res.ID
		again := time.Now()
		if sb, err = r.setup(ctx, req); err != nil {
			return cancelled(ctx, err)
		}
		setup = time.Since(again)
		err = r.execute(ctx, p, sb, res, hooks)
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
	// A kept workspace is answered first, and then what the run left on
	// its disk is put on the host's disk (syncfs: its state and files
	// survive a host crash from then on, not only a restart of agentrun)
	// and torn down: the session's next run waits for both
	// (Lease.Ending), without being refused, and its lease is released
	// only once the disk is unmounted. The answer does not wait for the
	// sync (2 to 3 ms of a warm call here).
	if lease != nil {
		lease.Ending()
	}
	answer()
	if lease != nil {
		if serr := sb.ws.Sync(); serr != nil && err == nil {
			err = fmt.Errorf("keeping the session's files: %w", serr)
		}
		if sb.stateKept {
			if serr := lease.SyncState(); serr != nil && err == nil {
				err = serr
			}
		}
	}
	if cerr := sb.undo.Clean(); cerr != nil && err == nil {
		err = fmt.Errorf("cleaning up: %w", cerr)
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
func approver(hook approvals.RunFunc, res *result.Result) approvals.Func {
	if hook == nil {
		return nil
	}
	// The id is read when a request is held, once the program runs: a
	// pooled run's is its sandbox's, set after this.
	return func(ctx context.Context, a approvals.Approval) approvals.Decision { return hook(ctx, res.ID, a) }
}

// pullOptions bounds the pull of a task's image by policy.registries,
// unless the config that resolved the plan names that image itself.
func (r *Runner) pullOptions(p *task.Plan) image.PullOptions {
	if p.OwnImage {
		return image.PullOptions{}
	}
	return image.PullOptions{Registries: r.regs}
}

// sandbox is a ready sandbox from the pool with req's files written in,
// or else one set up for req now. A run in a kept session takes only a
// warm one, whose workspace gets the session's disk (adoptSession). It
// sets the result's ID to the sandbox's.
func (r *Runner) sandbox(ctx context.Context, req request) (*sandbox, error) {
	// A pooled sandbox's proxy has denied everything since it was made: it
	// gets this run's policy, and no other, as the run takes it.
	claim := func(sb *sandbox) error {
		if sb.proxy == nil {
			return nil
		}
		return r.bindNetwork(sb, req.plan, req.approve, req.res)
	}
	sb := r.pool.takeFor(req.plan, req.img, req.lease != nil, claim)
	if sb == nil {
		return r.setup(ctx, req)
	}
	if req.lease != nil && sb.fileSize < r.sessions.MaxBytes() {
		// Made before sessions.max_bytes grew: its file size limit is
		// not the session's.
		r.pool.ended(sb)
		r.pool.failed(req.plan, errors.New("a warm sandbox's file size limit is below sessions.max_bytes (changed since it was made)"))
		if err := sb.undo.Clean(); err != nil {
			return nil, err
		}
		return r.setup(ctx, req)
	}
	req.res.ID = sb.id
	if err := r.handOver(sb, req); err != nil {
		r.pool.ended(sb)
		return nil, errors.Join(err, sb.undo.Clean())
	}
	return sb, nil
}

// handOver makes sb, a sandbox taken from the pool, req's: its files in
// its workspace, or in the kept session's disk that becomes its
// workspace, and, for a run with state, the request its launcher reads.
func (r *Runner) handOver(sb *sandbox, req request) error {
	if req.lease == nil {
		return sb.ws.Write(req.files, sb.uid, sb.uid)
	}
	if err := r.adoptSession(sb, req); err != nil {
		return err
	}
	if st := launcher.NewStateRequest(req.plan, r.cfg.Sessions.StateBytes()); st != nil {
		return st.Write(sb.display)
	}
	return nil
}

// adoptSession makes the kept session of req.lease the workspace of sb, a
// warm sandbox taken from the pool, before its launcher goes on: the
// session's disk is mounted beside sb's workspace in its run dir (so that
// gc finds it there if agentrun dies), req's files are written in, and an
// id-mapped copy of it, with the workspace's flags (nosuid, nodev,
// noexec), is mounted on sb's workspace, whose mount is shared, so that
// it propagates to the sandbox's /workspace, its slave
// (workspace.Share, spec.WithWorkspaceSlave). The sandbox's own tmpfs
// stays under it, empty. The sandbox's processes were made before the
// run and are the launcher's alone, which enters the new /workspace
// after the hand-over (agentrun_warm.py).
func (r *Runner) adoptSession(sb *sandbox, req request) error {
	if !sb.sessionReady {
		return errors.New("a pooled sandbox whose workspace cannot take a kept session's disk")
	}
	stage := filepath.Join(filepath.Dir(sb.ws.Dir), "session")
	if err := req.lease.Mount(stage); err != nil {
		return err
	}
	ws, err := workspace.Adopt(stage, r.sessions.MaxBytes(), spec.UID, spec.GID, req.files)
	if err != nil {
		return err
	}
	// Its Close comes first at the end; the copy on sb's workspace goes
	// with that workspace's, once the container is gone, and the lease
	// is released after both.
	sb.undo.Add(ws.Close)
	if err := stateIn(ws, req.lease, req.plan); err != nil {
		return err
	}
	attrs := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC)
	if err := uidpool.RemapOnto(stage, sb.ws.Dir, sb.idmap, attrs); err != nil {
		return err
	}
	sb.ws, sb.lease = ws, req.lease
	return nil
}

// execute runs the program of sb to its end and collects its files;
// hooks get its output and display bundles as they come.
func (r *Runner) execute(ctx context.Context, p *task.Plan, sb *sandbox, res *result.Result, hooks runapi.Hooks) (err error) {
	display := launcher.NewDisplayReader(sb.display, p.Limits.OutputBytes, hooks.Display)
	stop := display.Watch()
	out, err := sb.prep.Exec(ctx, backend.Program{Stdin: p.Stdin, Timeout: p.Limits.Timeout, OutputLimit: p.Limits.OutputBytes, Output: backend.OutputFunc(hooks.Output)})
	stop()
	if out != nil {
		fillOutcome(res, out)
	}
	if err != nil {
		return err
	}
	display.Finish(res)
	if p.KeepState {
		res.State, sb.stateKept = keepState(sb, launcher.ReadState(sb.display), r.cfg.Sessions.StateBytes())
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
	// tmp is a live sandbox's /tmp, a tmpfs the host made (liveTmp);
	// nil for a run's, whose /tmp is its own.
	tmp *workspace.Workspace
	// display is its display directory, where a Python run's values are
	// shown (internal/launcher), held open; nil without one.
	display *safefs.Dir
	// sessionReady: a warm sandbox, whose workspace can take a kept
	// session's disk (adoptSession); fileSize is what its file size
	// limit follows beside /tmp's size.
	sessionReady bool
	fileSize     int64
	// idmap, for a sessionReady sandbox, is the id map of the session's
	// disk on its workspace (uidpool.IDMap), made ahead.
	idmap *os.File
	spec  *specs.Spec
	proxy *proxy.Proxy // its egress proxy, nil without network
	// net is its network namespace when this process holds it: a
	// network's, or a live sandbox's loopback (nil for a run with none).
	net  *netns.Net
	prep backend.Prepared
	undo cleanup.Cleanup
	// settle ends what the run used once its program has ended and fills
	// the result with what it recorded (the proxy's report); it runs
	// before the result is final.
	settle cleanup.Cleanup

	// lease is the kept session whose disk is ws, once the sandbox is a
	// run's in one; stateKept: its run's state became the session's
	// (keepState), which is synced with the disk after the answer.
	lease     *session.Lease
	stateKept bool
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
	approve approvals.Func
	// toolCount counts the run's tool calls (nil: not counted).
	toolCount func(server, tool, outcome string)
	// warm, if not nil, is the launcher argv of a warm sandbox (warm.go):
	// its program is the launcher, started by setup, which returns once it
	// is ready. Only the pool makes warm sandboxes.
	warm []string
	// live: the sandbox is a live one (runner.Live), whose ports this
	// process dials inside its network namespace, which it holds even
	// with no network.
	live bool
	// compile: the sandbox compiles the run launcher (launcher.Codes); it
	// gets the launcher's source and nothing else of the launcher's.
	compile bool
}

// runRequest is the request for the sandbox of a run of p that sets its
// own up, under its result's id, with its files.
func runRequest(p *task.Plan, img *image.Image, res *result.Result, lease *session.Lease, approve approvals.Func) request {
	return request{plan: p, img: img, id: res.ID, files: runFiles(p), lease: lease, res: res, approve: approve}
}

// poolRequest is the request for a sandbox made ahead for the pool for
// plans of p's shape, with no files; warm as in request.
func poolRequest(p *task.Plan, img *image.Image, warm []string) request {
	return request{plan: p, img: img, id: newID(), pooled: true, warm: warm, live: p.Live}
}

// setup makes the sandbox that req asks for. It is the setup order of one
// run: every step that makes something on the host pushes its undo, and
// on error everything made is undone. ctx is the run's (the pool's fill
// context for a pooled one, which Close cancels): once it is cancelled,
// the backend's Prepare stops. A *warmError is the failure of a warm
// sandbox's launcher.
func (r *Runner) setup(ctx context.Context, req request) (_ *sandbox, err error) {
	if req.pooled == (req.res != nil) {
		return nil, errors.New("a sandbox is set up for a run, with its result, or for the pool, without one")
	}
	be := r.backends[req.plan.Runtime]
	if be == nil {
		return nil, fmt.Errorf("runtime %q is not available", req.plan.Runtime)
	}
	s := &sandboxSetup{r: r, req: req, be: be, traits: be.Traits(), sb: &sandbox{id: req.id}}
	defer func() {
		if err == nil {
			return
		}
		if s.handover != nil {
			s.handover.Close() // Prepare closes it on its own errors
		}
		if cerr := s.sb.undo.Clean(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up: %w", cerr))
		}
	}()
	for _, step := range []func() error{
		s.register,     // the run dir and its lock
		s.takeUID,      // the sandbox's own host uid and gid
		s.holdImage,    // the image stays in the store
		s.mountRootfs,  // a private overlay if need be; the program is there
		s.network,      // its namespaces and proxy, or the loopback alone
		s.workspace,    // a fresh one, or the kept session's disk
		s.liveTmp,      // a live sandbox's /tmp, the host's to reach
		s.identity,     // passwd and group naming its uid
		s.launcher,     // the Python launcher's files, display dir and state
		s.warmLauncher, // a warm sandbox's handover
		s.buildSpec,    // composed and validated
		// The container, up to its program's exec.
		func() error { return s.prepare(ctx) },
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return s.sb, nil
}

// sandboxSetup is one sandbox being set up: what setup's steps share. Each
// step adds what it makes to sb.undo, and what the spec needs of it to
// the fields below.
type sandboxSetup struct {
	r      *Runner
	req    request
	be     backend.Backend
	traits backend.Traits
	sb     *sandbox

	dir    string // the run dir
	rootfs string // the image's rootfs, or the run's overlay of it
	wsSize int64  // the workspace's size, which /tmp's file size limit follows
	// netOpts, idOpts and launchOpts are the spec options of the
	// network, the identity files and the launchers, in that order after
	// SandboxSpec's and the backend's own.
	netOpts, idOpts, launchOpts []spec.SpecOpt
	// handover, for a warm sandbox, is where its launcher says it is
	// ready.
	handover *backend.Handover
	// mounts is the undo's mark past the network (prepare): what is
	// undone above it is the run dir's own file systems (the workspace,
	// /tmp, etc, the display) and their handles, which the container's
	// removal neither needs nor touches.
	mounts int
}

// register makes the run dir and takes its lock.
func (s *sandboxSetup) register() error {
	dir, lock, err := s.r.register(s.req.id)
	if err != nil {
		return err
	}
	s.dir = dir
	s.sb.undo.Add(lock.Close) // last: the run is live until everything else is gone
	s.sb.undo.Add(func() error { return os.RemoveAll(dir) })
	return nil
}

// takeUID gives the sandbox its own uid and gid, so that no other run
// shares its per-user kernel limits; given back once all else is gone
// but the run dir, whose lock keeps gc off it until then. The reservation
// names the run dir: its state dir's gc is the one that may reclaim it.
func (s *sandboxSetup) takeUID() error {
	uid, err := s.r.uids.Take(s.dir)
	if err != nil {
		return fmt.Errorf("run_uids: %w", err)
	}
	s.sb.uid = int(uid)
	s.sb.undo.Add(func() error { return s.r.uids.Free(uid, s.dir) })
	return nil
}

// holdImage keeps the image in the store while the sandbox lives (a
// pooled one outlives the Get that found its image).
func (s *sandboxSetup) holdImage() error {
	release, err := s.r.store.Hold(s.req.img)
	if err != nil {
		return err
	}
	s.sb.undo.Add(release)
	return nil
}

// mountRootfs picks the sandbox's rootfs and checks that its program is
// there. A store image has its mount points; a dir: image may lack them,
// and then the run gets a private overlay so that nothing is created in
// it. So does every run of a backend that writes to its rootfs (runsc's
// gofer makes the init's mount point, /dev/init, in the root filesystem
// itself, not in the sandbox's /dev). A run with services gets one too,
// for the mount points of its CA.
func (s *sandboxSetup) mountRootfs() error {
	p, img := s.req.plan, s.req.img
	s.rootfs = img.Rootfs
	if !image.HasMountpoints(s.rootfs) || s.traits.PrivateRootfs || len(p.Services) > 0 {
		ov, err := mountOverlay(img.Rootfs, s.dir)
		if err != nil {
			return err
		}
		s.sb.undo.Add(ov.unmount)
		s.rootfs = ov.merged
	}
	return checkProgram(s.rootfs, p.Argv[0])
}

// network sets up the sandbox's network (Runner.network).
func (s *sandboxSetup) network() (err error) {
	s.netOpts, err = s.r.network(s.req, s.rootfs, s.dir, s.sb)
	s.mounts = s.sb.undo.Len()
	return err
}

// workspace makes the sandbox's workspace with the request's files: a
// fresh size-capped one, or the kept session's disk, mounted in the run
// dir.
func (s *sandboxSetup) workspace() error {
	p, sb := s.req.plan, s.sb
	wsDir := filepath.Join(s.dir, "workspace")
	s.wsSize = p.Limits.WorkspaceSize
	if s.req.lease == nil {
		ws, err := workspace.Create(wsDir, p.Limits.WorkspaceSize, sb.uid, sb.uid, s.req.files)
		if err != nil {
			return err
		}
		sb.ws = ws
		sb.undo.Add(sb.ws.Close)
		if s.req.warm != nil {
			// A run in a kept session may take it: its workspace can get
			// the session's disk, and its file size limit is the
			// session's (every file system the sandbox can write is
			// smaller: only the errors past them could tell).
			if err := ws.Share(); err != nil {
				return err
			}
			idmap, err := uidpool.IDMap(spec.UID, uint32(sb.uid))
			if err != nil {
				return err
			}
			sb.undo.Add(idmap.Close)
			sb.idmap, sb.sessionReady = idmap, true
			s.wsSize = max(s.wsSize, s.r.sessions.MaxBytes())
		}
		sb.fileSize = s.wsSize
		return nil
	}
	s.wsSize = s.r.sessions.MaxBytes()
	sb.fileSize = s.wsSize
	if err := s.req.lease.Mount(wsDir); err != nil {
		return err
	}
	// The disk keeps one owner, the sandbox user of the store, which
	// the run sees as its own uid through an id-mapped mount.
	ws, err := workspace.Adopt(wsDir, s.r.sessions.MaxBytes(), spec.UID, spec.GID, s.req.files)
	if err != nil {
		return err
	}
	sb.ws, sb.lease = ws, s.req.lease
	sb.undo.Add(sb.ws.Close)
	if err := stateIn(ws, s.req.lease, p); err != nil {
		return err
	}
	return uidpool.Remap(wsDir, spec.UID, uint32(sb.uid))
}

// liveTmp makes a live sandbox's /tmp a size-capped tmpfs mounted in the
// run dir (spec.WithTmpDir), as its workspace is, so that the host
// reaches its files (link-safe) as it does the workspace's: the tmpfs a
// run's spec mounts is in the sandbox's mount namespace alone, and
// runsc's in its own kernel. A run keeps its own.
func (s *sandboxSetup) liveTmp() error {
	if !s.req.live {
		return nil
	}
	tmp, err := workspace.CreateTmp(filepath.Join(s.dir, "tmp"), s.req.plan.Limits.TmpSize)
	if err != nil {
		return err
	}
	s.sb.tmp = tmp
	s.sb.undo.Add(tmp.Close)
	return nil
}

// identity writes the sandbox's identity files (identity).
func (s *sandboxSetup) identity() (err error) {
	s.idOpts, err = identity(s.rootfs, s.dir, s.sb.uid, &s.sb.undo)
	return err
}

// buildSpec composes the sandbox's spec, run as its own uid and gid, and
// validates it.
func (s *sandboxSetup) buildSpec() error {
	p, sb := s.req.plan, s.sb
	opts := append(SandboxSpec(p, s.traits.CgroupParent+"/"+sb.id, s.r.init, sb.ws.Dir, s.wsSize), s.netOpts...)
	opts = append(opts, s.idOpts...)
	if s.traits.Spec != nil {
		opts = append(opts, s.traits.Spec)
	}
	opts = append(opts, s.launchOpts...)
	if sb.sessionReady {
		opts = append(opts, spec.WithWorkspaceSlave())
	}
	if sb.tmp != nil {
		opts = append(opts, spec.WithTmpDir(sb.tmp.Dir))
	}
	opts = append(opts, spec.WithUser(uint32(sb.uid), uint32(sb.uid)))
	var err error
	if sb.spec, err = spec.New(s.rootfs, opts...); err != nil {
		return fmt.Errorf("building spec: %w", err)
	}
	if err := spec.Validate(sb.spec); err != nil {
		return fmt.Errorf("spec refused: %w", err)
	}
	return nil
}

// prepare creates the container, up to just before its program's exec;
// a warm sandbox's returns once its launcher is ready. Its removal runs
// beside the unmounts of the run dir's own file systems (s.mounts): the
// sandbox holds its own mounts of them, and the two are a run's longest
// undo steps; the image, the uid and the run dir wait for both.
func (s *sandboxSetup) prepare(ctx context.Context) error {
	sb := s.sb
	var err error
	c := &backend.Container{ID: sb.id, Spec: sb.spec, Handover: s.handover, Ahead: s.req.pooled}
	if sb.prep, err = s.be.Prepare(ctx, c); err != nil {
		return err
	}
	sb.undo.AddBeside(s.mounts, sb.prep.Destroy)
	if s.handover != nil {
		if err := s.handover.Ready(ctx, warmReadyWait); err != nil {
			if ctx.Err() != nil {
				return err // stopped, not a failure of the launcher
			}
			return &warmError{err}
		}
	}
	return nil
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
	rec.Tools = res.Tools
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
	return audit.Limits{Values: values, NetworkAllow: p.Allow.Entries(), NetworkServices: p.Services}
}

// newID returns a fresh run id, "ar-" and 16 hex digits.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ar-" + hex.EncodeToString(b[:])
}
