package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/shell"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/untrusted"
)

const sandboxUsage = `usage: agentrun sandbox [--server ADDR] [--config F] [--json] <command>
  create [--image I] [--allow HOST]... [--timeout D] [--session ID] [--tool T]...
                      make a live sandbox and print its id
  ls                  list the live sandboxes
  exec ID [--] CMD... run CMD in sandbox ID: its stdout and stderr here
                      (escaped on a terminal), its exit status ours
  ps ID               list the processes of sandbox ID
  kill [--signal S] ID PID
                      send signal S (default SIGTERM) to process PID
  rm ID               end sandbox ID: everything in it is gone
`

// serverFlags are the flags that say which serve a command talks to.
type serverFlags struct {
	addr, cfgPath *string
}

func addServerFlags(fs *flag.FlagSet) serverFlags {
	return serverFlags{
		addr:    fs.String("server", os.Getenv("AGENTRUN_SERVER"), "agentrun serve's address (unix:///path or tcp://host:port; token from $AGENTRUN_TOKEN); default: the config's server.listen"),
		cfgPath: fs.String("config", "", "the config whose server.listen and server.token to use (default "+config.DefaultPath+")"),
	}
}

// client is a client of the serve f names.
func (f serverFlags) client() (*server.Client, error) {
	addr, token := *f.addr, os.Getenv("AGENTRUN_TOKEN")
	if addr == "" {
		var err error
		if addr, token, err = serverOf(*f.cfgPath, token); err != nil {
			return nil, err
		}
	}
	return server.NewClient(addr, token)
}

// sandboxFlags are the flags of a sandbox's shape.
type sandboxFlags struct {
	image   *string
	allow   *hostList
	timeout *string
	session *string
	tools   *hostList
}

func addSandboxFlags(fs *flag.FlagSet) sandboxFlags {
	f := sandboxFlags{image: fs.String("image", "", "the sandbox's image (default: the server's)"), allow: &hostList{},
		timeout: fs.String("timeout", "", "its lifetime, such as 10m (default: the server's sandboxes.default_timeout)"),
		session: fs.String("session", "", "a kept session whose files are its /workspace, and stay"), tools: &hostList{}}
	fs.Var(f.allow, "allow", "a host it may reach (repeatable)")
	fs.Var(f.tools, "tool", "a tool server of the config it may call (repeatable)")
	return f
}

// request is the sandbox the flags shape; a --timeout that is not a
// duration is a usage error.
func (f sandboxFlags) request() (server.SandboxRequest, error) {
	req := server.SandboxRequest{Image: *f.image, Network: task.Network{Allow: *f.allow}, Session: *f.session, Tools: *f.tools}
	if err := req.Timeout.UnmarshalText([]byte(*f.timeout)); err != nil {
		return req, fmt.Errorf("--timeout %q: %w", *f.timeout, err)
	}
	return req, nil
}

// hostList is a repeated flag's values.
type hostList []string

func (h *hostList) String() string     { return strings.Join(*h, ",") }
func (h *hostList) Set(v string) error { *h = append(*h, v); return nil }

// cmdSandbox manages live sandboxes on agentrun serve.
func cmdSandbox(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	srv := addServerFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprint(stderr, sandboxUsage)
		return 2
	}
	sub, rest := fs.Arg(0), fs.Args()[1:]
	fail := func(err error) int {
		fmt.Fprintf(stderr, "agentrun sandbox %s: %v\n", sub, err)
		return 1
	}
	c, err := srv.client()
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := func(v any, text func()) int {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(v); err != nil {
				return 1
			}
			return 0
		}
		text()
		return 0
	}
	sfs := flag.NewFlagSet("sandbox "+sub, flag.ContinueOnError)
	sfs.SetOutput(stderr)
	switch sub {
	case "create":
		shape := addSandboxFlags(sfs)
		if err := sfs.Parse(rest); err != nil || sfs.NArg() != 0 {
			fmt.Fprint(stderr, sandboxUsage)
			return 2
		}
		req, err := shape.request()
		if err != nil {
			fmt.Fprintf(stderr, "agentrun sandbox create: %v\n", err)
			return 2
		}
		info, err := c.CreateSandbox(ctx, req)
		if err != nil {
			return fail(err)
		}
		return out(info, func() { fmt.Fprintln(stdout, info.ID) })
	case "ls":
		list, err := c.Sandboxes(ctx)
		if err != nil {
			return fail(err)
		}
		return out(list, func() {
			for _, sb := range list {
				fmt.Fprintf(stdout, "%s  expires %s\n", sb.ID, sb.ExpiresAt.UTC().Format(time.RFC3339))
			}
		})
	case "exec":
		pos, ok := parseInterspersed(sfs, rest)
		if !ok || len(pos) < 2 {
			fmt.Fprint(stderr, sandboxUsage)
			return 2
		}
		return sandboxExec(ctx, c, pos[0], pos[1:], stdout, stderr)
	case "ps":
		if len(rest) != 1 {
			fmt.Fprint(stderr, sandboxUsage)
			return 2
		}
		list, err := c.Processes(ctx, rest[0])
		if err != nil {
			return fail(err)
		}
		return out(list, func() {
			for _, p := range list {
				state := "running"
				if !p.Running && p.ExitCode != nil {
					state = "exit " + strconv.Itoa(*p.ExitCode)
				}
				fmt.Fprintf(stdout, "%6d  %-9s  %s  %s\n", p.Pid, state, p.Started.UTC().Format(time.RFC3339), printable(strings.Join(p.Command, " ")))
			}
		})
	case "kill":
		sig := sfs.String("signal", "SIGTERM", "the signal's name")
		pos, ok := parseInterspersed(sfs, rest)
		if !ok || len(pos) != 2 {
			fmt.Fprint(stderr, sandboxUsage)
			return 2
		}
		pid, err := strconv.Atoi(pos[1])
		if err != nil {
			fmt.Fprintf(stderr, "agentrun sandbox kill: pid %q is not a number\n", pos[1])
			return 2
		}
		if err := c.Signal(ctx, pos[0], pid, *sig); err != nil {
			return fail(err)
		}
		return 0
	case "rm":
		if len(rest) != 1 {
			fmt.Fprint(stderr, sandboxUsage)
			return 2
		}
		if err := c.DeleteSandbox(ctx, rest[0]); err != nil {
			return fail(err)
		}
		return 0
	}
	fmt.Fprint(stderr, sandboxUsage)
	return 2
}

// sandboxExec runs argv in sandbox id: its output on stdout and stderr,
// escaped where they are terminals (untrusted.Lines); its exit status as
// run's (125 when it could not run).
func sandboxExec(ctx context.Context, c *server.Client, id string, argv []string, stdout, stderr io.Writer) int {
	write := func(w io.Writer) func([]byte) {
		if isTerminal(w) {
			return func(b []byte) { io.WriteString(w, untrusted.Lines(string(b))) }
		}
		return func(b []byte) { w.Write(b) }
	}
	toOut, toErr := write(stdout), write(stderr)
	exit, err := c.Exec(ctx, id, server.ProcessRequest{Command: argv}, func(ev runapi.ProcessEvent) error {
		data, err := ev.Output()
		if err != nil {
			return err
		}
		switch ev.Event {
		case "stdout":
			toOut(data)
		case "stderr":
			toErr(data)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sandbox exec: %v\n", err)
		return 125
	}
	if exit.ExitCode == nil {
		fmt.Fprintln(stderr, "agentrun sandbox exec: the process ended without an exit status")
		return 125
	}
	return *exit.ExitCode
}

// cmdShell runs an interactive shell in a new live sandbox on serve, on
// this terminal, and ends the sandbox with it.
func cmdShell(args []string, stdin *os.File, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shell", flag.ContinueOnError)
	fs.SetOutput(stderr)
	srv := addServerFlags(fs)
	shape := addSandboxFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "agentrun shell: no arguments expected")
		return 2
	}
	req, err := shape.request()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun shell: %v\n", err)
		return 2
	}
	c, err := srv.client()
	if err != nil {
		fmt.Fprintf(stderr, "agentrun shell: %v\n", err)
		return 1
	}
	// SIGINT is the terminal's own (raw mode passes Ctrl-C on as a
	// byte); SIGTERM and SIGHUP end the shell and its sandbox.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	code, err := shell.Run(ctx, c, req, stdin, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun shell: %v\n", err)
		if errors.Is(err, context.Canceled) {
			return 130
		}
		return 125
	}
	return code
}
