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

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/runtime"
	"github.com/agentrun/agentrun/runtime/runc"
	"github.com/agentrun/agentrun/runtime/runsc"
)

// Runner runs task plans. It is safe for concurrent use.
type Runner struct {
	cfg      *config.Config
	backends map[string]runtime.Backend
	audit    *audit.Log
	runsDir  string
	runcDir  string
	pool     *netns.Pool
	store    *image.Store
	runsc    *runsc.Backend // nil when runsc is not installed
	runscErr error          // why it is nil
	runscDir string
}

// New prepares a runner from cfg: its state directories and backends.
func New(cfg *config.Config, log *audit.Log) (*Runner, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("agentrun must run as root (it creates namespaces, cgroups and mounts)")
	}
	r := &Runner{cfg: cfg, audit: log, backends: map[string]runtime.Backend{},
		runsDir: filepath.Join(cfg.StateDir, "runs"), runcDir: filepath.Join(cfg.StateDir, "runc"),
		runscDir: filepath.Join(cfg.StateDir, "runsc")}
	var err error
	if err = os.MkdirAll(r.runsDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	if r.store, err = image.Open(cfg.StoreDir); err != nil {
		return nil, err
	}
	if r.pool, err = netns.NewPool(netns.DefaultCIDR); err != nil {
		return nil, err
	}
	lc, err := runc.New(r.runcDir)
	if err != nil {
		return nil, err
	}
	r.backends[config.RuntimeLibcontainer] = lc
	// runsc is optional: a run that asks for it gets the reason it is missing.
	if r.runsc, r.runscErr = runsc.New(cfg.Runsc.Path, cfg.Runsc.Flags, r.runscDir); r.runscErr == nil {
		r.backends[config.RuntimeRunsc] = r.runsc
	}
	return r, nil
}

// Run runs p and returns its result; it never returns nil. A failure of
// agentrun itself is reported in the result's Error (exit status 125).
func (r *Runner) Run(ctx context.Context, p *task.Plan) *result.Result {
	if p.Runtime == config.RuntimeLibcontainer {
		runc.WarmCgroupLock()
	}
	res := &result.Result{ID: newID(), Session: p.Session, Image: p.Image, Runtime: p.Runtime, Files: map[string]result.File{}}
	res.Network.Allowed, res.Network.Denied = []result.Allowed{}, []result.Denied{}
	rec := &audit.Record{Time: time.Now().UTC(), ID: res.ID, Session: p.Session, TaskHash: p.TaskHash,
		Image: p.Image, Runtime: p.Runtime, Limits: auditLimits(p)}

	if err := r.run(ctx, p, res); err != nil {
		res.Error = err.Error()
	}
	fillRecord(rec, res)
	if r.audit != nil {
		if err := r.audit.Write(rec); err != nil && res.Error == "" {
			res.Error = err.Error()
		}
	}
	return res
}

// run is the setup order of one run. Every step that makes something on
// the host pushes its undo; undo runs in reverse order on every path.
func (r *Runner) run(ctx context.Context, p *task.Plan, res *result.Result) (err error) {
	var undo cleanups
	defer func() {
		if cerr := undo.run(); cerr != nil && err == nil {
			err = fmt.Errorf("cleaning up: %w", cerr)
		}
	}()

	backend, ok := r.backends[p.Runtime]
	if !ok {
		if p.Runtime == config.RuntimeRunsc && r.runscErr != nil {
			return fmt.Errorf("runtime runsc is not available: %w", r.runscErr)
		}
		return fmt.Errorf("runtime %q is not available", p.Runtime)
	}
	img, err := r.store.Get(ctx, p.Image, image.PullOptions{})
	if err != nil {
		return fmt.Errorf("image %q: %w", p.Image, err)
	}
	res.ImageDigest = img.Digest

	dir, lock, err := r.register(res.ID)
	if err != nil {
		return err
	}
	undo.add(lock.Close) // last: the run is live until everything else is gone
	undo.add(func() error { return os.RemoveAll(dir) })

	rootfs := img.Rootfs
	// A store image has its mount points; a dir: image may lack them, and
	// then the run gets a private overlay so that nothing is created in it.
	if !image.HasMountpoints(rootfs) {
		ov, err := mountOverlay(img.Rootfs, dir)
		if err != nil {
			return err
		}
		undo.add(ov.unmount)
		rootfs = ov.merged
	}

	netOpts, err := r.network(p, dir, res, &undo)
	if err != nil {
		return err
	}

	files := p.Files
	if p.CodeFile != "" {
		files = make(map[string][]byte, len(p.Files)+1)
		for k, v := range p.Files {
			files[k] = v
		}
		files[p.CodeFile] = p.Code
	}
	ws, err := workspace.Create(filepath.Join(dir, "workspace"), p.Limits.WorkspaceSize, runtime.UID, runtime.GID, files)
	if err != nil {
		return err
	}
	undo.add(ws.Close)

	opts := append([]runtime.SpecOpt{
		runtime.WithArgs(p.Argv...),
		runtime.WithEnv(p.Env),
		runtime.WithCgroupsPath("/agentrun/" + res.ID),
		runtime.WithMemory(p.Limits.Memory),
		runtime.WithCPUs(p.Limits.CPUs),
		runtime.WithPids(p.Limits.Pids),
		runtime.WithTmpSize(p.Limits.TmpSize, p.Limits.WorkspaceSize),
		runtime.WithWorkspace(ws.Dir),
		runtime.WithSeccomp(),
	}, netOpts...)
	if p.Runtime == config.RuntimeRunsc {
		opts = append(opts, runsc.SpecOpt())
	}
	spec, err := runtime.New(rootfs, opts...)
	if err != nil {
		return fmt.Errorf("building spec: %w", err)
	}
	if err := runtime.Validate(spec); err != nil {
		return fmt.Errorf("spec refused: %w", err)
	}

	out, err := backend.Run(ctx, &runtime.Container{
		ID: res.ID, Spec: spec, Stdin: p.Stdin, Timeout: p.Limits.Timeout, OutputLimit: p.Limits.OutputBytes,
	})
	if out != nil {
		fillOutcome(res, out)
	}
	if err != nil {
		return err
	}
	if len(p.Collect) > 0 {
		if res.Files, err = ws.Collect(p.Collect); err != nil {
			return err
		}
	}
	return nil
}

func fillOutcome(res *result.Result, o *runtime.Outcome) {
	res.ExitCode, res.Signal = o.ExitCode, o.Signal
	res.TimedOut, res.OOMKilled = o.TimedOut, o.OOMKilled
	res.Stdout, res.Stderr = string(o.Stdout.Data), string(o.Stderr.Data)
	res.StdoutTruncated, res.StderrTruncated = o.Stdout.Truncated, o.Stderr.Truncated
	res.StdoutBytes, res.StderrBytes = o.Stdout.Total, o.Stderr.Total
	res.DurationMS = o.Duration.Milliseconds()
	res.CPUMS = o.CPU.Milliseconds()
	res.MemoryPeakBytes = o.MemoryPeak
}

func fillRecord(rec *audit.Record, res *result.Result) {
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

func auditLimits(p *task.Plan) audit.Limits {
	l := p.Limits
	return audit.Limits{TimeoutMS: l.Timeout.Milliseconds(), Memory: l.Memory, CPUs: l.CPUs, Pids: l.Pids,
		OutputBytes: l.OutputBytes, TmpSize: l.TmpSize, WorkspaceSize: l.WorkspaceSize, NetworkAllow: p.Allow}
}

// newID returns a fresh run id, "ar-" and 16 hex digits.
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return "ar-" + hex.EncodeToString(b[:])
}

// cleanups is a stack of undo steps, run in reverse order.
type cleanups []func() error

func (c *cleanups) add(f func() error) { *c = append(*c, f) }

func (c *cleanups) run() error {
	var errs []error
	for i := len(*c) - 1; i >= 0; i-- {
		if err := (*c)[i](); err != nil {
			errs = append(errs, err)
		}
	}
	*c = nil
	return errors.Join(errs...)
}
