package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/sandbox"
	"github.com/agentrun/agentrun/internal/server"
)

// connectTimeout bounds the wait for serve at the start of `agentrun mcp`.
const connectTimeout = 10 * time.Second

// cmdMCP serves MCP over stdio. It forwards to agentrun serve when one is
// reachable (--server, $AGENTRUN_SERVER, else the server.listen of the
// config it would run tasks under); with none, as root, it runs tasks
// itself. It says on stderr which it does.
func cmdMCP(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file, when running tasks here (default "+config.DefaultPath+")")
	serverAddr := fs.String("server", os.Getenv("AGENTRUN_SERVER"), "forward to this agentrun serve (unix:///path or tcp://host:port; token from $AGENTRUN_TOKEN); default: the config's server.listen, if it answers")
	localOnly := fs.Bool("local", false, "run tasks here (root), never forward to a server")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "agentrun mcp: no arguments expected")
		return 2
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "agentrun mcp: "+format+"\n", args...) }
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *localOnly {
		if *serverAddr != "" {
			logf("--local and --server (or $AGENTRUN_SERVER) exclude each other")
			return 2
		}
		logf("--local: running sandboxes here (cold, slower)")
		return serveLocal(ctx, *cfgPath, logf)
	}
	explicit := *serverAddr != ""
	addr, token := *serverAddr, os.Getenv("AGENTRUN_TOKEN")
	if !explicit {
		var err error
		if addr, token, err = serverOf(*cfgPath, token); err != nil {
			logf("%v", err)
			return 1
		}
	}
	srv, ferr := forward(ctx, addr, token, logf)
	// Only a server that is not there lets root run tasks here: one that
	// is there but refuses (a wrong token) is an error.
	if ferr != nil && (explicit || os.Geteuid() != 0 || !absent(ferr)) {
		logf("%v", ferr)
		if !explicit && absent(ferr) {
			logf("running tasks here instead needs root")
		}
		return 1
	}
	if ferr != nil {
		logf("no serve at %s: running sandboxes here (cold, slower)", addr)
		return serveLocal(ctx, *cfgPath, logf)
	}
	if explicit && *cfgPath != "" {
		logf("--config is the server's own when forwarding to %s", addr)
		srv.Close()
		return 2
	}
	logf("using serve at %s", addr)
	return serveStdio(ctx, srv, logf)
}

// serverOf is where to look for serve, and its token, when no address was
// given: the server.listen of the config that running here would use
// (cfgPath, else the default file), and its server.token unless token is
// set. Without cfgPath, a default file that cannot be read (not root's
// caller) gives the default socket.
func serverOf(cfgPath, token string) (addr, tok string, err error) {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		if cfgPath != "" {
			return "", "", err
		}
		cfg = config.Default()
	}
	if token == "" {
		token = cfg.Server.Token
	}
	return cfg.Server.Listen.String(), token, nil
}

// serveLocal serves MCP over stdio with the server local makes, then,
// once its calls have ended (serveStdio waits for them), closes what it
// made: the launcher's compile going on, if any, is stopped and its
// sandbox torn down, the shared tool servers stop, and the audit log is
// closed. A failure there turns exit status 0 into 1.
func serveLocal(ctx context.Context, cfgPath string, logf func(string, ...any)) int {
	srv, closeRunner, code := local(cfgPath, logf)
	if srv == nil {
		return code
	}
	code = serveStdio(ctx, srv, logf)
	if err := closeRunner(); err != nil {
		logf("%v", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func serveStdio(ctx context.Context, srv *mcpserver.Server, logf func(string, ...any)) int {
	if err := srv.ServeStdio(ctx); err != nil {
		logf("%v", err)
		return 1
	}
	return 0
}

// absent says whether err is that no server listens at the address.
func absent(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// forward connects to serve's /mcp at addr with the bearer token (""
// none).
func forward(ctx context.Context, addr, token string, logf func(string, ...any)) (*mcpserver.Server, error) {
	c, err := server.NewClient(addr, token)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	// The health check tells a server that is not there (absent) from
	// one that refuses.
	if _, err := c.Health(ctx); err != nil {
		return nil, fmt.Errorf("agentrun serve at %s: %w", addr, err)
	}
	url, hc := c.HTTP("/mcp")
	srv, err := mcpserver.Forward(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, logf)
	if err != nil {
		return nil, fmt.Errorf("agentrun serve at %s: %w", addr, err)
	}
	return srv, nil
}

// local makes the server that runs tasks in this process, as serve would:
// the same policy, quotas and admission; closeRunner stops what it runs
// in the background and closes its runner and audit log, once the
// server's calls have ended.
func local(cfgPath string, logf func(string, ...any)) (srv *mcpserver.Server, closeRunner func() error, code int) {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		logf("%v", err)
		return nil, nil, 1
	}
	r, closeLog, err := openRunner(cfg, cfg.Audit, logf)
	if err != nil {
		logf("%v", err)
		return nil, nil, 1
	}
	longLived(r, logf)
	api := server.New(cfg, r.Run, nil)
	api.Sessions = r.Sessions()
	api.Sandboxes = sandbox.NewDoor(r, cfg.Sandboxes)
	srv = mcpserver.New(cfg, api.RunTask, logf)
	srv.AddSessions(api.Sessions)
	addShell(srv, api)
	// As serve's daemon does: the approval webhook's senders, then the
	// runner and the log. (srv's Close, before, ended its sandboxes.)
	return srv, func() error { api.Close(); return closeLog() }, 0
}

// addShell gives m exec_command and write_stdin when api has live
// sandboxes: each MCP session's is made as POST /v1/sandboxes makes one
// with no fields, under the config's defaults.
func addShell(m *mcpserver.Server, api *server.Server) {
	if api.Sandboxes == nil {
		return
	}
	m.AddShell(func(ctx context.Context) (runapi.Sandbox, error) {
		return api.NewSandbox(ctx, &server.SandboxRequest{}, "")
	})
}
