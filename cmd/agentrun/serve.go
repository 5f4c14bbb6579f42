package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/e2b"
	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/server"
)

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

// serve runs the API (server.Daemon) with MCP at /mcp until SIGTERM or
// SIGINT; SIGHUP reloads the config at cfgPath.
func serve(cfg *config.Config, cfgPath string, stderr io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "agentrun serve: "+format+"\n", args...) }
	d, err := server.Listen(cfg, logf)
	if err != nil {
		return err
	}
	defer d.Close()
	r, closeLog, err := openRunner(cfg, cfg.Audit, logf)
	if err != nil {
		return err
	}
	defer closeLog()
	longLived(r, logf)
	d.ConfigPath = cfgPath
	d.Egress = runner.IsEgress
	d.PeerUID = runner.PeerUID
	d.Sandboxes = sandbox.NewDoor(r, cfg.Sandboxes.Max)
	d.MCP = func(api *server.Server) server.Door {
		m := mcpserver.New(cfg, api.RunTask, api.Logf)
		m.AddSessions(api.Sessions)
		addShell(m, api)
		return m
	}
	d.E2B = func(sandboxes runapi.Sandboxes, guess func(*http.Request, func() bool) (bool, time.Duration)) (server.Door, error) {
		h, err := e2b.New(cfg, sandboxes, logf)
		if err != nil {
			return nil, err
		}
		h.Guess = guess
		return h, nil
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt, syscall.SIGHUP)
	defer signal.Stop(sig)
	// The pool is there even when the config sizes none: a reload may.
	pool := r.NewPool(cfg.Server.PoolSizes())
	r.UsePool(pool)
	return d.Run(r.Run, pool, r.Sessions(), sig)
}
