package runner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
)

// Live is a sandbox set up as a run's is, every step of it (its own uid,
// cgroup, network, workspace, identity, spec), whose program, its
// holder, runs from Live on and keeps it up; its other processes are
// started with Spawn. Close kills everything in it and tears it all
// down as after a run. It is internal/sandbox's.
type Live struct {
	// ID is the sandbox's, which names its run dir and cgroup.
	ID string
	// ImageDigest is its image's.
	ImageDigest string
	// UID is the host uid and gid its processes run as.
	UID int
	// Workspace is its /workspace, whose files the host reaches only
	// through its link-safe methods, and which the files written there
	// are owned by on the host as FileUID and FileGID: UID, or in a kept
	// session's disk the store's owner, which the sandbox sees as UID
	// through an id-mapped mount.
	Workspace        *workspace.Workspace
	FileUID, FileGID int
	// Tmp is its /tmp, a tmpfs the host made, reached as Workspace is.
	Tmp *workspace.Workspace
	// Result gets the network report once it ended.
	Result *result.Result

	sb   *sandbox
	live backend.Live
	// sockets: its processes' outputs are sockets (Traits.SocketOutputs).
	sockets bool
	created time.Time
	limits  audit.Limits
	audit   *audit.Log
	// holder is the holder's outcome (the whole cgroup's usage), set
	// before ended is closed; nil if it could not run.
	holder *backend.Outcome
	cancel context.CancelFunc
	ended  chan struct{}
	close  func() error
}

// Live sets up p's sandbox, whose program p.Argv holds it up (the
// image's own, never one of agentrun's), and starts it: one the pool has
// ready for p's shape (made ahead for a live sandbox, never used), else
// one set up now. p is marked Live. It runs until
// Close, or until it ends by itself (Ended), or at the latest after
// lifetime. Only a backend whose Prepared is a backend.Live can. A plan
// with a kept session (KeepWorkspace) has the session's disk as its
// /workspace and holds the session for its whole life, as a run does:
// a run or another sandbox of the session is refused (session.ErrBusy)
// until Close has synced the disk and unmounted it. A plan that names
// tools gets their broker at http://tools.agentrun for its whole life,
// as a run does; its calls held for approval, and its network's held
// requests, are decided by the approver ctx carries
// (runapi.WithApprover; none: denied), and are in Record; its calls
// are counted by the counter ctx carries (runapi.WithToolCounter).
func (r *Runner) Live(ctx context.Context, p *task.Plan, lifetime time.Duration) (_ *Live, err error) {
	be, ok := r.backends[p.Runtime]
	if !ok {
		if err := r.unavailable[p.Runtime]; err != nil {
			return nil, fmt.Errorf("runtime %s is not available: %w", p.Runtime, err)
		}
		return nil, fmt.Errorf("runtime %q is not available", p.Runtime)
	}
	var lease *session.Lease
	if p.KeepWorkspace {
		if lease, err = r.sessions.Lock(p.Session); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				lease.Release()
			}
		}()
	}
	img, err := r.store.Get(ctx, p.Image, r.pullOptions(p))
	if err != nil {
		return nil, err
	}
	defer img.Release() // the sandbox holds it for its own life
	res := &result.Result{ID: newID(), Image: p.Image, Runtime: p.Runtime, ImageDigest: img.Digest}
	res.Network.Allowed, res.Network.Denied, res.Network.Failed = []result.Allowed{}, []result.Denied{}, []result.Failed{}
	if p.Offline() {
		res.Network = result.NoNetwork()
	}
	p.Live = true
	req := runRequest(p, img, res, lease, approver(runapi.ApproverFrom(ctx), res))
	req.toolCount = runapi.ToolCounterFrom(ctx)
	req.live = true
	// A ready sandbox of the same shape from the pool, made for a live
	// sandbox, untouched, its network (if any) bound to p's allowlist
	// as it is taken; else one set up now. A kept session's disk is
	// mounted as a sandbox is set up: such a sandbox never comes from the
	// pool (nor one with tools, which the pool does not keep).
	var sb *sandbox
	if lease == nil {
		sb = r.pool.take(p, img, func(sb *sandbox) error {
			if sb.proxy == nil {
				return nil
			}
			return r.bindNetwork(sb, p, req.approve, res)
		})
	}
	if sb != nil {
		// Its replacement need not wait for the holder, which lives on.
		r.pool.ended(sb)
		res.ID = sb.id
	} else if sb, err = r.setup(ctx, req); err != nil {
		return nil, err
	}
	live, ok := sb.prep.(backend.Live)
	if !ok {
		return nil, errors.Join(fmt.Errorf("runtime %s cannot run a live sandbox yet", p.Runtime), sb.undo.Clean())
	}
	// The holder runs on a context of its own: the sandbox outlives the
	// request that made it.
	hold, cancel := context.WithCancel(context.Background())
	l := &Live{ID: sb.id, ImageDigest: img.Digest, UID: sb.uid, Workspace: sb.ws, Tmp: sb.tmp, FileUID: sb.uid, FileGID: sb.uid, Result: res,
		sb: sb, live: live, sockets: be.Traits().SocketOutputs, cancel: cancel, ended: make(chan struct{}),
		created: time.Now(), limits: auditLimits(p), audit: r.audit}
	go func() {
		defer close(l.ended)
		l.holder, _ = sb.prep.Exec(hold, backend.Program{Timeout: lifetime, OutputLimit: 4096})
	}()
	if lease != nil {
		l.FileUID, l.FileGID = int(spec.UID), int(spec.GID)
	}
	l.close = func() error {
		cancel()
		<-l.ended
		err := sb.settle.Clean()
		if lease == nil {
			return errors.Join(err, sb.undo.Clean())
		}
		// As after a run in a kept session: a next user of the session
		// waits for the tear-down instead of being refused; the files
		// are put on the host's disk, the disk unmounted, and only then
		// the session let go.
		lease.Ending()
		if serr := sb.ws.Sync(); serr != nil {
			err = errors.Join(err, fmt.Errorf("keeping the session's files: %w", serr))
		}
		err = errors.Join(err, sb.undo.Clean())
		lease.Release()
		return err
	}
	return l, nil
}

// Spawn starts a process in the sandbox (backend.Live).
func (l *Live) Spawn(p backend.Process) (backend.Spawned, error) {
	select {
	case <-l.ended:
		return nil, errors.New("the sandbox has ended")
	default:
	}
	return l.live.Spawn(p)
}

// Pipes makes the stdin, stdout and stderr of a process to Spawn, as
// the sandbox's runtime needs them (Traits.SocketOutputs).
func (l *Live) Pipes() (*backend.Pipes, error) {
	p, err := backend.NewPipes()
	if err != nil || !l.sockets {
		return p, err
	}
	if err := p.SocketOutputs(); err != nil {
		p.CloseAll()
		return nil, err
	}
	return p, nil
}

// DialPort connects to TCP port on the sandbox's loopback (127.0.0.1,
// else ::1), from a socket made inside its network namespace: the
// sandbox's own view, never through its proxy, and no listener of the
// host's that the sandbox could reach.
func (l *Live) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: not a TCP port", port)
	}
	select {
	case <-l.ended:
		return nil, errors.New("the sandbox has ended")
	default:
	}
	if d, ok := l.live.(backend.PortDialer); ok {
		return d.DialPort(ctx, port)
	}
	n := l.sb.net
	if n == nil {
		return nil, errors.New("the sandbox's network namespace is not this process's to reach")
	}
	c, err := n.DialContext(ctx, netns.Sandbox, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if errors.Is(err, syscall.ECONNREFUSED) {
		// A server on the IPv6 loopback alone.
		if c6, err6 := n.DialContext(ctx, netns.Sandbox, "tcp6", net.JoinHostPort("::1", strconv.Itoa(port))); err6 == nil {
			return c6, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("port %d in the sandbox: %w", port, err)
	}
	return c, nil
}

// Ended is closed once the sandbox's holder has ended: killed by Close,
// at its lifetime, or by itself (the sandbox is then dead, and waits for
// Close).
func (l *Live) Ended() <-chan struct{} { return l.ended }

// Close kills every process of the sandbox (its whole cgroup) and tears
// everything down as after a run. It may be called once.
func (l *Live) Close() error { return l.close() }

// Record is the sandbox's audit record as far as the runner knows it,
// once Close has returned: its image, runtime, limits, network report,
// tool calls, life and the usage of its whole cgroup (cpu, memory peak,
// an OOM kill). The caller adds its id, user and processes, and writes
// it with WriteRecord.
func (l *Live) Record() *audit.Record {
	res := l.Result
	rec := &audit.Record{Time: l.created.UTC(), Kind: audit.KindSandbox,
		Image: res.Image, ImageDigest: res.ImageDigest, Runtime: res.Runtime, Limits: l.limits,
		Network: res.Network, Tools: res.Tools, DurationMS: time.Since(l.created).Milliseconds()}
	if o := l.holder; o != nil {
		rec.CPUMS, rec.MemoryPeakBytes, rec.OOMKilled = o.CPU.Milliseconds(), o.MemoryPeak, o.OOMKilled
	}
	return rec
}

// WriteRecord appends rec to the runner's audit log, if it has one.
func (l *Live) WriteRecord(rec *audit.Record) error {
	if l.audit == nil {
		return nil
	}
	return l.audit.Write(rec)
}
