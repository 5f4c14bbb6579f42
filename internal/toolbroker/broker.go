// Package toolbroker brokers a run's calls to MCP tool servers (spec §13):
// the program asks over HTTP (http://tools.agentrun, served by the run's
// proxy), the broker rules each call by the server's rules, holds it for a
// human where a rule says so, makes it with the official MCP Go SDK's
// client to a stdio server it starts for the run (never as root, in a
// cgroup of its own, with the config's environment alone) or to a
// streamable-HTTP server, bounds it, and records it (never its arguments
// or result: their SHA-256).
//
// Every refusal and failure of a call is an answer to that call (HTTP
// 4xx/5xx with {"error": "..."}); none ends the run.
package toolbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/uidpool"
)

// Host is the name the sandbox reaches the broker by.
const Host = "tools.agentrun"

// Server is one tool server a run may call, as the config declares it.
type Server struct {
	Name string
	// Command is a stdio server's argv; URL a streamable-HTTP server's
	// endpoint. Exactly one is set.
	Command []string
	Env     []EnvVar // a stdio server's whole environment
	// UID and GID are the config's user of a stdio server, never 0. As
	// root agentrun runs the server as a uid and gid of its own from the
	// pool (Options.UIDs), with GID as its one supplementary group unless
	// it is nobody's; without root, as itself, which they must name.
	UID uint32
	GID uint32
	// Allow is the hosts a stdio server may reach (network.allow entries,
	// through a proxy: Options.Network); none, no network at all.
	Allow   []string
	Shared  bool // one server for every run (see Shared)
	URL     string
	Headers []netpolicy.Inject // sent to URL, read from root-only files at each connect
	Rules   []Rule
}

// EnvVar is an environment variable of a stdio server: Value, or Prefix
// then the content of the root-only File, read when the server starts.
type EnvVar struct {
	Name, Value, Prefix, File string
}

// Rule allows the tools whose names match one of Tools (path.Match
// globs); Approve holds such a call for a human.
type Rule struct {
	Tools   []string
	Approve bool
}

// Limits bound one run's calls; past any, the call gets an error and the
// run goes on.
type Limits struct {
	Calls         int           // calls per run
	Concurrent    int           // calls at once
	ArgumentBytes int64         // a call's arguments as JSON
	ResultBytes   int64         // a call's result as JSON
	CallTimeout   time.Duration // a call to the server, the approval's wait excluded
}

// Options make one run's broker.
type Options struct {
	Run     string // the run's id, for logs and the servers' cgroups
	Servers []Server
	Limits  Limits
	// Approve decides calls a rule holds; nil denies them ("no way to
	// ask"). ApprovalTimeout bounds the wait (0: approvals.DefaultTimeout).
	Approve         approvals.Func
	ApprovalTimeout time.Duration
	// CgroupParent is where each stdio server's cgroup is made; "" makes
	// none (a test's unprivileged servers: then only the process group is
	// killed at Close).
	CgroupParent string
	// CgroupLockDir is the directory of the tool servers' cgroup-parent
	// lock (state.LockCgroupParent): with it, a server's cgroup is made
	// under the shared lock and the parent removed, under the exclusive
	// one, once empty; "" leaves the parent in place.
	CgroupLockDir string
	// UIDs is the pool of host ids (run_uids) from which each stdio
	// server takes a uid and gid of its own, shared with no sandbox and no
	// other server, for as long as its process lives; needed as root.
	// The reservation's owner is UIDOwner (the run's dir) then
	// "/tool-" and the server's name; a shared server's is its Shared's.
	UIDs     *uidpool.Range
	UIDOwner string
	// Network makes the network of a stdio server whose Allow names hosts;
	// nil refuses to start such a server. A server without Allow gets a
	// network namespace of its own with its loopback alone.
	Network func(Server) (*Network, error)
	// Shared holds the servers marked Shared, kept between runs; nil
	// starts every server for this run alone.
	Shared *Shared
	// Count, if not nil, counts each call by server, tool and outcome
	// (metrics.Metrics.ToolCalled): server is "-" for a name the run does
	// not have, tool "-" for a call no rule allowed.
	Count func(server, tool, outcome string)
	// Logf logs host-side failures (never arguments or results).
	Logf func(format string, args ...any)
}

// Bounds of a run's broker beyond Limits.
const (
	// MaxRecords is how many calls a run's record lists; Dropped counts
	// the rest.
	MaxRecords = 1000
	// MaxListedTools is how many tools GET /v1/tools lists of one server,
	// and MaxListBytes the most JSON it keeps of a server's list.
	MaxListedTools = 1000
	MaxListBytes   = 4 << 20
	// maxToolName is how much of a tool's escaped name a record keeps.
	maxToolName = 256
	// closeWait bounds Close's wait for calls in flight to end once
	// cancelled.
	closeWait = 10 * time.Second
)

// Broker is one run's tool broker. It is safe for concurrent use.
type Broker struct {
	opts    Options
	limits  Limits
	servers map[string]*runServer
	order   []string // the servers' names, in Options' order
	sem     chan struct{}

	ctx    context.Context // ends at Close: every call in flight with it
	cancel context.CancelFunc
	calls  sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	made    int // calls counted against Limits.Calls
	records []result.ToolCall
	dropped int
}

// runServer is one server as this run sees it: its connection (its own,
// or the Shared one) and its list, made once for the run.
type runServer struct {
	srv     Server
	conn    *conn
	own     bool   // the run's own: Close stops it
	release func() // a shared one's: Close lets it go

	listOnce sync.Once
	tools    []listedTool
	listErr  error
}

// New makes the broker of one run; it starts nothing (a stdio server
// starts at the run's first call to it, or at Start).
func New(opts Options) (*Broker, error) {
	l, err := checkLimits(opts.Limits)
	if err != nil {
		return nil, err
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	b := &Broker{opts: opts, limits: l, servers: map[string]*runServer{}, sem: make(chan struct{}, l.Concurrent),
		records: []result.ToolCall{}}
	// Every server is checked before any shared one is taken, so that
	// a refusal leaves no hold on one.
	names := map[string]bool{}
	for _, s := range opts.Servers {
		if err := checkServer(s); err != nil {
			return nil, fmt.Errorf("tool server %q: %w", s.Name, err)
		}
		if names[s.Name] {
			return nil, fmt.Errorf("tool server %q: named twice", s.Name)
		}
		names[s.Name] = true
	}
	for _, s := range opts.Servers {
		rs := &runServer{srv: s}
		start := startOpts{cgPath: cgroupPath(opts.CgroupParent, opts.Run, s.Name), lockDir: opts.CgroupLockDir,
			uids: opts.UIDs, owner: opts.UIDOwner + "/tool-" + s.Name, network: opts.Network}
		if s.Shared && len(s.Command) > 0 && opts.Shared != nil {
			rs.conn, rs.release = opts.Shared.conn(s, start, opts.CgroupParent, l, opts.Logf)
		} else {
			rs.conn, rs.own = newConn(s, start, l, opts.Logf), true
		}
		b.servers[s.Name] = rs
		b.order = append(b.order, s.Name)
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b, nil
}

// checkLimits refuses limits of zero or less: the caller passes
// LimitsFromConfig's.
func checkLimits(l Limits) (Limits, error) {
	if l.Calls <= 0 || l.Concurrent <= 0 || l.ArgumentBytes <= 0 || l.ResultBytes <= 0 || l.CallTimeout <= 0 {
		return l, fmt.Errorf("tool limits %+v: every bound must be above zero (LimitsFromConfig)", l)
	}
	return l, nil
}

// checkServer checks what the config's validation has: exactly one of
// Command and URL, and never root for a stdio server.
func checkServer(s Server) error {
	switch {
	case (len(s.Command) > 0) == (s.URL != ""):
		return errors.New("want exactly one of command and url")
	case len(s.Command) > 0 && (s.UID == 0 || s.GID == 0):
		return errors.New("a stdio tool server never runs as root (uid or gid 0)")
	}
	return nil
}

// Start starts the run's stdio servers ahead of its first call (for a
// pooled sandbox's run). It returns the first failure; a failed server
// stays failed for the run.
func (b *Broker) Start(ctx context.Context) error {
	var errs []error
	for _, name := range b.order {
		rs := b.servers[name]
		if len(rs.srv.Command) == 0 {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, b.limits.CallTimeout)
		_, err := rs.conn.session(sctx)
		cancel()
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Handler serves the sandbox's requests: GET /v1/tools, POST /v1/call.
func (b *Broker) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /v1/tools", b.tracked(b.serveTools))
	mux.Handle("POST /v1/call", b.tracked(b.serveCall))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not an endpoint of the tool broker: GET /v1/tools, POST /v1/call")
	})
	return mux
}

// Report is the run's calls so far.
func (b *Broker) Report() *result.Tools {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &result.Tools{Calls: append([]result.ToolCall{}, b.records...), Dropped: b.dropped}
}

// record adds a call to the run's record, within MaxRecords, and counts
// it in the metrics.
func (b *Broker) record(c result.ToolCall, outcome, toolLabel string) {
	b.mu.Lock()
	if len(b.records) < MaxRecords {
		b.records = append(b.records, c)
	} else {
		b.dropped++
	}
	b.mu.Unlock()
	if b.opts.Count != nil {
		server := "-"
		if _, ok := b.servers[c.Server]; ok {
			server = c.Server
		}
		b.opts.Count(server, toolLabel, outcome)
	}
}

// Close stops the run's servers (every process of their cgroups) and
// waits for calls in flight to end: they are cancelled first, and the
// wait is bounded.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	done := make(chan struct{})
	go func() { b.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
		b.opts.Logf("toolbroker: run %s: calls still in flight %s after Close cancelled them", b.opts.Run, closeWait)
	}
	var errs []error
	for _, name := range b.order {
		switch rs := b.servers[name]; {
		case rs.own:
			if err := rs.conn.close(); err != nil {
				errs = append(errs, err)
			}
		case rs.release != nil:
			rs.release()
		}
	}
	return errors.Join(errs...)
}

// Shared keeps the servers marked Shared between runs, for a runner's
// lifetime. Its zero value is ready to use. A shared server sees every
// run's calls (and what they leave in it): mark only servers that keep
// nothing of one call for the next.
type Shared struct {
	// Dir is where the shared servers' lock is made (the tools' state
	// dir), needed with a uid pool: each shared server's uid reservation
	// names a lock file there that sh holds while it lives, so that the
	// gc of a dead agentrun's knows them (ReclaimShared).
	Dir string

	mu     sync.Mutex
	closed bool
	conns  map[string]*sharedConn // the current one of each server, by sharedKey
	stale  map[*sharedConn]bool   // replaced ones that runs still hold
	made   int                    // connections made: each has a cgroup of its own
	lock   *os.File               // made at the first uid's reservation
}

// sharedLock starts the name of the lock file of a Shared in its Dir.
const sharedLock = "shared-"

// uidOwner is the owner of the uid reservation of shared server name: the
// lock file of sh, made and held from its first use, then "/" and name.
// sh.mu is held.
func (sh *Shared) uidOwner(name string) (string, error) {
	if sh.lock == nil {
		if sh.Dir == "" || !filepath.IsAbs(sh.Dir) {
			return "", errors.New("no state dir for the shared tool servers' lock")
		}
		if err := os.MkdirAll(sh.Dir, 0o700); err != nil {
			return "", err
		}
		var b [8]byte
		rand.Read(b[:])
		f, err := state.Lock(filepath.Join(sh.Dir, sharedLock+hex.EncodeToString(b[:])), unix.LOCK_SH)
		if err != nil {
			return "", fmt.Errorf("the shared tool servers' lock: %w", err)
		}
		sh.lock = f
	}
	return sh.lock.Name() + "/" + name, nil
}

// ReclaimShared frees the reservations of uids that shared servers of a
// dead agentrun (one that held a lock in dir, its Shared's Dir) left, and
// removes its lock: its servers died with it (each is the init of its pid
// namespace, killed when agentrun dies). It returns the ids freed.
func ReclaimShared(uids *uidpool.Range, dir string) ([]uint32, error) {
	locks := map[string]bool{} // by path: dead
	freed, err := uids.Reclaim(func(owner string) bool {
		lock := filepath.Dir(owner)
		if filepath.Dir(lock) != dir || !strings.HasPrefix(filepath.Base(lock), sharedLock) {
			return false
		}
		if dead, ok := locks[lock]; ok {
			return dead
		}
		f, err := os.OpenFile(lock, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, fs.ErrNotExist) {
			locks[lock] = true
			return true
		}
		if err != nil {
			locks[lock] = false
			return false
		}
		defer f.Close()
		locks[lock] = state.Flock(f, unix.LOCK_EX|unix.LOCK_NB) == nil
		return locks[lock]
	})
	for lock, dead := range locks {
		if dead {
			os.Remove(lock)
		}
	}
	return freed, err
}

// sharedConn is a shared server's connection and the brokers (runs)
// that hold it.
type sharedConn struct {
	*conn
	name  string
	users int
}

// conn is the shared connection to s for one run's broker, made at
// first use, or again when the last one failed to start or its config
// changed (a reload of serve), to start as start says but for its cgroup
// (one of its own under parent) and its uid's owner (sh's): the one it replaces is stopped once no
// run holds it, so that a run keeps the server it started with. release
// lets the connection go, once: the broker's Close.
func (sh *Shared) conn(s Server, start startOpts, parent string, l Limits, logf func(string, ...any)) (c *conn, release func()) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	key := sharedKey(s, l)
	if e := sh.conns[key]; e != nil && !e.failed() && !sh.closed {
		e.users++
		return e.conn, sh.releaser(e)
	}
	sh.made++
	start.cgPath = cgroupPath(parent, fmt.Sprintf("shared%d", sh.made), s.Name)
	var err error
	if start.uids != nil {
		start.owner, err = sh.uidOwner(fmt.Sprintf("%s.%d", s.Name, sh.made))
	}
	e := &sharedConn{conn: newConn(s, start, l, logf), name: s.Name, users: 1}
	switch {
	case sh.closed:
		e.fail(errors.New("the shared tool servers are stopped"))
		return e.conn, func() {}
	case err != nil:
		e.fail(fmt.Errorf("tool server %s failed to start: %w", s.Name, err))
		return e.conn, func() {}
	}
	if sh.conns == nil {
		sh.conns, sh.stale = map[string]*sharedConn{}, map[*sharedConn]bool{}
	}
	for k, old := range sh.conns {
		if old.name != s.Name {
			continue
		}
		delete(sh.conns, k)
		if old.users == 0 {
			go old.close()
		} else {
			sh.stale[old] = true
		}
	}
	sh.conns[key] = e
	return e.conn, sh.releaser(e)
}

// releaser is the release of one run's hold on e: the last run to let
// go of a replaced connection stops its server.
func (sh *Shared) releaser(e *sharedConn) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			sh.mu.Lock()
			e.users--
			last := e.users == 0 && sh.stale[e]
			if last {
				delete(sh.stale, e)
			}
			sh.mu.Unlock()
			if last {
				if err := e.close(); err != nil {
					e.logf("toolbroker: replaced shared tool server %s: %v", e.name, err)
				}
			}
		})
	}
}

// sharedKey identifies a shared server by its whole config and the bound
// of its frames, so that a changed config starts a new one.
func sharedKey(s Server, l Limits) string {
	return fmt.Sprintf("%#v|%d|%d", s, l.ResultBytes, l.CallTimeout)
}

// Close stops every shared server, the replaced ones still held too.
func (sh *Shared) Close() error {
	sh.mu.Lock()
	sh.closed = true
	conns := slices.Collect(maps.Values(sh.conns))
	for e := range sh.stale {
		conns = append(conns, e)
	}
	sh.conns, sh.stale = nil, nil
	sh.mu.Unlock()
	var errs []error
	for _, c := range conns {
		if err := c.close(); err != nil {
			errs = append(errs, err)
		}
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.lock != nil && len(errs) == 0 {
		// Every server is gone and its uid given back. Otherwise the lock
		// stays held, until agentrun exits and gc reclaims what is left.
		os.Remove(sh.lock.Name())
		sh.lock.Close()
		sh.lock = nil
	}
	return errors.Join(errs...)
}
