package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/task"
)

// socketGroup is the group given access to the unix socket when it exists.
const socketGroup = "agentrun"

func cmdServe(args []string, stderr io.Writer) int {
	cfg, code := loadConfig("serve", args, stderr)
	if cfg == nil {
		return code
	}
	if err := serve(cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "agentrun serve: %v\n", err)
		return 1
	}
	return 0
}

// serve runs the API until SIGTERM or SIGINT, then lets the runs going on
// finish (or kills them after the policy's longest timeout), empties the
// warm pool and removes the socket.
func serve(cfg *config.Config, stderr io.Writer) error {
	if strings.HasPrefix(cfg.Server.Listen, "tcp://") && cfg.Server.Token == "" {
		return errors.New("server.listen is tcp: set server.token, which every request must then carry as a bearer token")
	}
	log, err := audit.Open(cfg.Audit)
	if err != nil {
		return err
	}
	defer log.Close()
	r, err := runner.New(cfg, log)
	if err != nil {
		return err
	}
	if _, err := r.GC(); err != nil {
		fmt.Fprintf(stderr, "agentrun serve: gc: %v\n", err)
	}

	var poolStats func() runner.PoolStats
	if len(cfg.Server.Pool) > 0 {
		pool := r.NewPool(cfg.Server.Pool)
		defer func() {
			if err := pool.Close(); err != nil {
				fmt.Fprintf(stderr, "agentrun serve: %v\n", err)
			}
		}()
		poolStats = pool.Stats
		for ref, n := range cfg.Server.Pool {
			if n == 0 {
				continue
			}
			// The pool starts with the shape of a default task of the image;
			// the placeholder code is never run, only its file name counts.
			// The config's own image is the default of a task that names
			// none (and so not bound by policy.local_images).
			seedTask := fmt.Sprintf(`{"image":%q,"code":"pass"}`, ref)
			if ref == cfg.Image {
				seedTask = `{"code":"pass"}`
			}
			seed, err := task.Load([]byte(seedTask), cfg)
			if err == nil {
				err = pool.Seed(seed)
			}
			if err != nil {
				return fmt.Errorf("server.pool[%q]: %w", ref, err)
			}
		}
	}

	ln, cleanup, err := listen(cfg.Server.Listen)
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Fprintf(stderr, "agentrun serve: listening on %s\n", ln.Addr())

	base, kill := context.WithCancel(context.Background())
	defer kill()
	api := server.New(cfg, r.RunWith, poolStats)
	api.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, "agentrun serve: "+format+"\n", args...) }
	mcpSrv := mcpserver.New(cfg, api.RunTask, api.Logf)
	defer mcpSrv.Close()
	api.Handle("/mcp", mcpSrv.HTTPHandler())
	srv := &http.Server{
		Handler:           api.Handler(),
		BaseContext:       func(net.Listener) context.Context { return base },
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sig)
	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case s := <-sig:
		fmt.Fprintf(stderr, "agentrun serve: %v: finishing the runs going on\n", s)
	}
	// The config is valid: its policy timeout parses.
	longest, _ := config.ParseDuration(cfg.Policy.Timeout)
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

// listen opens the listener of server.listen. A unix socket is made
// 0660, for root and the agentrun group (when there is one); a stale
// socket file from a server that died is replaced, a live one is not.
func listen(addr string) (net.Listener, func(), error) {
	if hp, ok := strings.CutPrefix(addr, "tcp://"); ok {
		ln, err := net.Listen("tcp", hp)
		if err != nil {
			return nil, nil, fmt.Errorf("listening on %s: %w", addr, err)
		}
		return ln, func() {}, nil
	}
	path := strings.TrimPrefix(addr, "unix://")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, nil, fmt.Errorf("creating socket dir: %w", err)
	}
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
