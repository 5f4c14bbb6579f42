package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
)

// Daemon is `agentrun serve`'s lifetime around a Server: the socket it
// listens on, the warm pool, the expiry of idle sessions, the reloads of
// its config and, at the end, the drain of the runs going on. Make one
// with Listen, then Run it.
type Daemon struct {
	// ConfigPath is the config file a SIGHUP reads again ("" the default).
	ConfigPath string
	// MCP, when set, makes the door served at /mcp beside the API, on the
	// API it runs its tasks through.
	MCP func(api *Server) Door
	// E2B, when set, makes the door served at /e2b (spec §18) on the
	// live sandboxes, behind its own credentials (E2B's keys and
	// tokens) rather than the API's token.
	// guess is the API's throttle of wrong credentials (Server.Guess),
	// which the door's keys and tokens are checked under.
	E2B func(sandboxes runapi.Sandboxes, guess func(*http.Request, func() bool) (bool, time.Duration)) (Door, error)
	// Egress is the API's Server.Egress: whether a connection is one a
	// run's proxy of this process dialled.
	Egress func(client, server netip.AddrPort) bool
	// PeerUID is the API's Server.PeerUID: which user of the host owns a
	// local TCP client's socket.
	PeerUID func(client, server netip.AddrPort) (uint32, bool)
	// Sandboxes are the API's Server.Sandboxes, the live sandboxes of
	// this host, all ended when the daemon stops; nil: none.
	Sandboxes runapi.Sandboxes

	logf    func(format string, args ...any)
	ln      net.Listener
	closeLn func()

	mu   sync.Mutex // held by a reload
	cfg  *config.Config
	api  *Server
	pool runapi.Pool
	door Door // nil without MCP
	e2b  Door // nil without E2B
}

// Door is another protocol spoken on the API's socket, behind the same
// token (MCP's /mcp).
type Door interface {
	HTTPHandler() http.Handler
	// Shutdown lets the door's calls going on finish, or kills their runs
	// when ctx ends first, then closes its sessions.
	Shutdown(ctx context.Context)
	// Close kills its runs going on and waits until they are gone.
	Close()
	// Reload makes cfg what the door tells its clients of the config
	// (MCP's tool description and schema: languages, limits, tools),
	// as the API takes it for the runs that come next.
	Reload(cfg *config.Config)
}

// Listen checks cfg's server section and opens its socket: the one
// systemd passed (socket activation, LISTEN_FDS), or else a new one on
// server.listen, its directory made first. It comes before the runner
// makes anything (the state dir): a wrong socket is refused with nothing
// to undo. logf gets what the daemon logs, from now on.
func Listen(cfg *config.Config, logf func(format string, args ...any)) (*Daemon, error) {
	addr := cfg.Server.Listen
	if cfg.Server.NeedsToken(addr.Network) {
		return nil, errors.New("server.listen is tcp: " + noToken)
	}
	if err := approvals.CheckSecret("server.approvals", cfg.Server.Approvals.WebhookSecretFile); err != nil {
		return nil, err
	}
	// The socket's own dir, which the agentrun group may enter, is made
	// before the runner makes the state dir.
	if err := socketDir(addr, cfg.StateDir, logf); err != nil {
		return nil, err
	}
	ln, closeLn, err := listenerOf(cfg, addr)
	if err != nil {
		return nil, err
	}
	return &Daemon{cfg: cfg, logf: logf, ln: ln, closeLn: closeLn}, nil
}

// Close closes the socket: one made on a unix server.listen is removed,
// one systemd passed stays systemd's.
func (d *Daemon) Close() { d.closeLn() }

// Run serves the API with run (the runner's), and with pool, which it
// seeds now and empties at the end; sessions is the store of kept
// sessions, whose idle ones expire while it runs. A SIGHUP from sig
// reloads the config at ConfigPath (reload); any other signal (SIGTERM,
// SIGINT) lets the runs going on finish, or kills them after the
// policy's longest timeout, and Run returns. Under systemd it says
// READY=1 once it listens and its pool is filled, RELOADING=1 and READY=1
// around a reload, and STOPPING=1 at the end (NOTIFY_SOCKET).
func (d *Daemon) Run(run runapi.Func, pool runapi.Pool, sessions *session.Store, sig <-chan os.Signal) error {
	defer func() {
		if err := pool.Close(); err != nil {
			d.logf("%v", err)
		}
	}()
	cfg := d.cfg
	pool.SetWarm(cfg)
	poolErrors, err := runapi.SeedPool(context.Background(), cfg, pool, d.logf)
	if err != nil {
		return err
	}
	d.logf("listening on %s", d.ln.Addr())

	base, kill := context.WithCancel(context.Background())
	defer kill()
	api := New(cfg, run, pool.Stats)
	api.Logf = d.logf
	api.PoolErrors = poolErrors
	api.Sessions = sessions
	api.Egress = d.Egress
	api.PeerUID = d.PeerUID
	if d.Sandboxes != nil {
		d.Sandboxes.SetMax(cfg.Sandboxes.Max)
		api.Sandboxes = d.Sandboxes
	}
	defer api.Close()
	var door Door
	if d.MCP != nil {
		door = d.MCP(api)
		defer door.Close()
		api.Handle("/mcp", door.HTTPHandler())
	}
	var e2b Door
	if d.E2B != nil && d.Sandboxes != nil {
		if e2b, err = d.E2B(d.Sandboxes, api.Guess); err != nil {
			return err
		}
		defer e2b.Close()
		api.HandleOwnAuth(E2BPrefix, e2b.HTTPHandler())
		api.HandleNames(func(c *config.Config) string { return c.E2B.Domain }, e2b.HTTPHandler())
	}
	d.mu.Lock()
	d.api, d.pool, d.door, d.e2b = api, pool, door, e2b
	d.mu.Unlock()
	srv := api.HTTPServer()
	srv.BaseContext = func(net.Listener) context.Context { return base }
	served := make(chan error, 1)
	go func() { served <- srv.Serve(d.ln) }()
	go d.expire(base, sessions)
	go notifyReady(pool, cfg.Server.PoolSizes(), d.logf)

	if err := d.wait(served, sig); err != nil {
		return err
	}
	d.drain(srv, door, kill)
	return nil
}

// wait serves until a signal other than SIGHUP, reloading the config on
// each SIGHUP; it fails when serving does.
func (d *Daemon) wait(served <-chan error, sig <-chan os.Signal) error {
	for {
		select {
		case err := <-served:
			return fmt.Errorf("serving: %w", err)
		case s := <-sig:
			if s != syscall.SIGHUP {
				notify("STOPPING=1")
				d.logf("%v: finishing the runs going on", s)
				return nil
			}
			notify("RELOADING=1")
			d.reloadFile()
			notify("READY=1")
		}
	}
}

// expire removes the sessions idle past sessions.ttl every minute until
// ctx ends: while serve runs, not only at its start.
func (d *Daemon) expire(ctx context.Context, sessions *session.Store) {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if _, err := sessions.GC(now); err != nil {
				d.logf("session gc: %v", err)
			}
		}
	}
}

// drain ends every live sandbox first (their processes' streams end
// with them), then lets the runs going on finish within the current
// policy's longest timeout (and 5 s more), then kills those left: kill
// cancels every run, whose sandboxes are killed and removed.
func (d *Daemon) drain(srv *http.Server, door Door, kill func()) {
	if d.Sandboxes != nil {
		if err := d.Sandboxes.CloseAll(); err != nil {
			d.logf("ending the live sandboxes: %v", err)
		}
	}
	d.mu.Lock()
	longest := d.cfg.Policy.Timeout.Duration()
	d.mu.Unlock()
	grace, cancel := context.WithTimeout(context.Background(), longest+5*time.Second)
	defer cancel()
	if door != nil {
		// MCP sessions hold streams open: they end once their calls are done.
		go door.Shutdown(grace)
	}
	if err := srv.Shutdown(grace); err != nil {
		kill()
		srv.Close()
	}
}

// reloadFile reads the config at ConfigPath again and applies it
// (reload), logging what came of it.
func (d *Daemon) reloadFile() {
	next, err := config.Load(d.ConfigPath)
	applied := false
	if err == nil {
		applied, err = d.reload(next)
	}
	switch {
	case !applied:
		d.logf("SIGHUP: config %s refused, the old one stays: %v", d.ConfigPath, err)
	case err != nil:
		d.logf("SIGHUP: config %s reloaded; %v", d.ConfigPath, err)
	default:
		d.logf("SIGHUP: config %s reloaded", d.ConfigPath)
	}
}

// reload applies next to the runs that come next: every key that
// config.ReloadTable says a reload applies (task defaults, policy,
// languages, tools and tool_limits, which a run takes from the plan the
// API resolved under next, server quotas, queue, max_concurrent, token,
// hosts, approvals and the pool: Server.Reload, the door's Reload, the
// pool's Resize and SetWarm). A config that changes a key that only a
// restart can apply (config.RestartOnly: the message names each), that
// removes the token of a TCP socket, or whose webhook secret or pool
// images are wrong, is refused as a whole: applied is false and the
// config before stays. A config applied whose pool cannot fill now has
// an error all the same.
func (d *Daemon) reload(next *config.Config) (applied bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if keys := config.RestartOnly(d.cfg, next); len(keys) > 0 {
		return false, fmt.Errorf("%s changed, which takes a restart", strings.Join(keys, ", "))
	}
	if next.Server.NeedsToken(next.Server.Listen.Network) {
		return false, errors.New("server.listen is tcp: server.token may not be removed")
	}
	if err := approvals.CheckSecret("server.approvals", next.Server.Approvals.WebhookSecretFile); err != nil {
		return false, err
	}
	if _, err := runapi.PoolSeeds(next); err != nil {
		return false, err
	}
	d.api.Reload(next)
	if d.door != nil {
		d.door.Reload(next)
	}
	if d.e2b != nil {
		d.e2b.Reload(next)
	}
	d.pool.Resize(next.Server.PoolSizes())
	d.pool.SetWarm(next)
	d.cfg = next
	failed, _ := runapi.SeedPool(context.Background(), next, d.pool, func(string, ...any) {})
	if len(failed) > 0 {
		return true, fmt.Errorf("applied, but the pool cannot fill: %v", failed)
	}
	return true, nil
}

// notify sends state to systemd's NOTIFY_SOCKET, when there is one.
func notify(state string) {
	_, _ = daemon.SdNotify(false, state)
}

// readyWait bounds how long serve waits for its pool before it tells
// systemd it is ready anyway (a pool that cannot fill is in /healthz).
const readyWait = 60 * time.Second

// notifyReady sends READY=1 once the pool holds sizes (or after readyWait).
func notifyReady(pool runapi.Pool, sizes map[string]int, logf func(string, ...any)) {
	deadline := time.Now().Add(readyWait)
	for !poolFull(pool.Stats(), sizes) {
		if time.Now().After(deadline) {
			logf("pool not filled after %v (%s): ready without it", readyWait, pool.Stats().LastErr)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	notify("READY=1")
}

func poolFull(st runapi.PoolStats, sizes map[string]int) bool {
	for ref, n := range sizes {
		if st.Ready[ref] < n {
			return false
		}
	}
	return true
}
