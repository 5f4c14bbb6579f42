package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/server"
)

// socketGroup is the group given access to the unix socket when it exists.
const socketGroup = "agentrun"

func cmdServe(args []string, stderr io.Writer) int {
	cfg, code := loadConfig("serve", args, stderr)
	if cfg == nil {
		return code
	}
	if err := serve(cfg, configPath(args), stderr); err != nil {
		fmt.Fprintf(stderr, "agentrun serve: %v\n", err)
		return 1
	}
	return 0
}

// serve runs the API until SIGTERM or SIGINT, then lets the runs going on
// finish (or kills them after the policy's longest timeout), empties the
// warm pool and removes the socket. SIGHUP reloads the config at cfgPath.
//
// Under systemd it takes its socket from socket activation (LISTEN_FDS),
// says READY=1 once it listens and its pool is filled, and STOPPING=1 on
// SIGTERM (NOTIFY_SOCKET).
func serve(cfg *config.Config, cfgPath string, stderr io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "agentrun serve: "+format+"\n", args...) }
	addr := cfg.Server.Listen
	if addr.Network == "tcp" && cfg.Server.Token == "" {
		return errors.New("server.listen is tcp: set server.token, which every request must then carry as a bearer token")
	}
	if err := checkWebhookSecret("server.approvals", cfg.Server.Approvals.WebhookSecretFile); err != nil {
		return err
	}
	// Before the runner makes the state dir: the socket's own dir, which
	// the agentrun group may enter, is made first.
	if err := socketDir(addr, cfg.StateDir, stderr); err != nil {
		return err
	}
	// Before the runner makes anything: a wrong socket from systemd is
	// refused with nothing to undo.
	ln, cleanup, err := listenerOf(cfg, addr)
	if err != nil {
		return err
	}
	defer cleanup()
	r, closeLog, err := openRunner(cfg, cfg.Audit, logf)
	if err != nil {
		return err
	}
	defer closeLog()
	logSeccomp(r, logf)

	// The pool is there even when the config sizes none: a reload may.
	pool := r.NewPool(cfg.Server.PoolSizes())
	r.UsePool(pool)
	defer func() {
		if err := pool.Close(); err != nil {
			logf("%v", err)
		}
	}()
	pool.SetWarm(cfg)
	poolErrors, err := seedPool(context.Background(), cfg, pool, logf)
	if err != nil {
		return err
	}
	logf("listening on %s", ln.Addr())

	base, kill := context.WithCancel(context.Background())
	defer kill()
	api := server.New(cfg, r.Run, pool.Stats)
	api.Logf = logf
	api.PoolErrors = poolErrors
	api.Sessions = r.Sessions()
	api.Egress = runner.IsEgress
	defer api.Close()
	mcpSrv := mcpserver.New(cfg, api.RunTask, api.Logf)
	mcpSrv.AddSessions(api.Sessions)
	defer mcpSrv.Close()
	api.Handle("/mcp", mcpSrv.HTTPHandler())
	srv := api.HTTPServer()
	srv.BaseContext = func(net.Listener) context.Context { return base }
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	// Sessions idle past sessions.ttl go while serve runs, not only at
	// its start.
	go func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-base.Done():
				return
			case now := <-tick.C:
				if _, err := r.Sessions().GC(now); err != nil {
					api.Logf("session gc: %v", err)
				}
			}
		}
	}()

	go notifyReady(pool, cfg.Server.PoolSizes(), logf)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt, syscall.SIGHUP)
	defer signal.Stop(sig)
	for stop := false; !stop; {
		select {
		case err := <-served:
			return fmt.Errorf("serving: %w", err)
		case s := <-sig:
			if s == syscall.SIGHUP {
				notify("RELOADING=1")
				next, err := reload(cfg, cfgPath, api, pool)
				switch {
				case next == nil:
					logf("SIGHUP: config %s refused, the old one stays: %v", cfgPath, err)
				case err != nil:
					cfg = next
					logf("SIGHUP: config %s reloaded; %v", cfgPath, err)
				default:
					cfg = next
					logf("SIGHUP: config %s reloaded", cfgPath)
				}
				notify("READY=1")
				continue
			}
			notify("STOPPING=1")
			logf("%v: finishing the runs going on", s)
			stop = true
		}
	}
	longest := cfg.Policy.Timeout.Duration()
	grace, cancel := context.WithTimeout(context.Background(), longest+5*time.Second)
	defer cancel()
	// MCP sessions hold streams open: they end once their calls are done.
	go mcpSrv.Shutdown(grace)
	if err := srv.Shutdown(grace); err != nil {
		kill() // cancels every run: their sandboxes are killed and removed
		srv.Close()
	}
	return nil
}

// socketDir makes the directory of a unix server.listen when it is
// missing: 0750, root and the agentrun group (when there is one), so that
// the group can reach the socket and nothing else. The state dir, private
// to root, must not hold it. An existing directory is left as it is, with
// a warning when the group cannot pass through it.
func socketDir(addr config.Addr, stateDir string, stderr io.Writer) error {
	if addr.Network != "unix" {
		return nil
	}
	dir := filepath.Dir(addr.Address)
	if rel, err := filepath.Rel(filepath.Clean(stateDir), dir); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("server.listen %s is inside state_dir %s, which only root may enter: put the socket elsewhere (the default is %s)",
			addr, stateDir, config.Default().Server.Listen)
	}
	gid := -1
	if g, err := user.LookupGroup(socketGroup); err == nil {
		if n, err := strconv.Atoi(g.Gid); err == nil {
			gid = n
		}
	}
	st, err := os.Stat(dir)
	if err == nil {
		if gid >= 0 && st.Mode().Perm()&0o011 == 0 {
			fmt.Fprintf(stderr, "agentrun serve: warning: %s (mode %v) does not let group %s reach the socket\n", dir, st.Mode().Perm(), socketGroup)
		}
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("socket dir: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	if gid >= 0 {
		if err := os.Chown(dir, 0, gid); err != nil {
			return fmt.Errorf("giving the socket dir to group %s: %w", socketGroup, err)
		}
	}
	// Mkdir's mode went through the umask.
	if err := os.Chmod(dir, 0o750); err != nil {
		return fmt.Errorf("setting the socket dir's mode: %w", err)
	}
	return nil
}

// listen opens the listener of server.listen. A unix socket is made
// 0660, for root and the agentrun group (when there is one); a stale
// socket file from a server that died is replaced, a live one is not.
func listen(addr config.Addr) (net.Listener, func(), error) {
	if addr.Network == "tcp" {
		ln, err := net.Listen("tcp", addr.Address)
		if err != nil {
			return nil, nil, fmt.Errorf("listening on %s: %w", addr, err)
		}
		return ln, func() {}, nil
	}
	path := addr.Address
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, nil, fmt.Errorf("%s: another agentrun serve is listening there", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("removing stale socket: %w", err)
	}
	// A new socket is 0755 under the usual umask: only root can connect
	// until the chmod.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("setting socket mode: %w", err)
	}
	if g, err := user.LookupGroup(socketGroup); err == nil {
		if gid, err := strconv.Atoi(g.Gid); err == nil {
			if err := os.Chown(path, 0, gid); err != nil {
				ln.Close()
				return nil, nil, fmt.Errorf("giving the socket to group %s: %w", socketGroup, err)
			}
		}
	}
	// The listener removes the socket file when closed.
	return ln, func() { ln.Close() }, nil
}
