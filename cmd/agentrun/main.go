// Command agentrun runs AI-agent code in single-use, locked-down Linux
// containers without a container daemon.
//
//	agentrun run [flags] task.json   run one task, print its result as JSON
//	agentrun task.json               the same
//
// and the commands of usage below (serve, worker, submit, result, approve,
// sessions, sandbox, shell, mcp, doctor, gc, pull, images, rmi, prune,
// version).
//
// This package parses arguments and the config, and wires the internal
// packages together: run, serve, worker and mcp open the audit log and the
// runner (internal/runner, which does a run's work, on the backends that
// internal/compose chooses) through one helper, openRunner, which also
// runs gc; serve, worker and mcp hand it to
// internal/server, internal/worker and internal/mcpserver. Its init makes
// the binary libcontainer's container init when it is re-executed as one
// (runc.InitHook), before anything else runs.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/agentrun/agentrun/runtime/runc"
	// Imported here, not only by runtime/runc, so that nsexec's
	// constructor runs before runtime/runc/prefault's (its package doc).
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

func init() {
	// libcontainer re-executes this binary as each container's init.
	runc.InitHook()
}

const usage = `usage: agentrun <command> [flags] [args]

commands:
  run [--config F] [--output F] [--format json|text] [--audit F] [--store DIR] TASK
        run TASK (a task.json file, or - for stdin) and print the result;
        flags may also follow TASK. --format text: the program's stdout on
        stdout and stderr on stderr (control characters escaped), then a
        summary, collected files and network denials on stderr
  run --server ADDR [--output F] [--format json|text] TASK
        the same on agentrun serve at ADDR (also $AGENTRUN_SERVER; token from
        $AGENTRUN_TOKEN): no root needed, only access to its socket
  [flags] TASK
        the same as run [flags] TASK
  serve [--config F]
        run tasks over HTTP (POST /v1/runs, GET /healthz) on server.listen,
        with the warm pool of server.pool; GET /metrics for Prometheus;
        socket activation and sd_notify under systemd; SIGHUP reloads the
        config for new runs; SIGTERM stops it
  worker [--config F]
        take tasks from NATS JetStream (config worker) and store their
        results there; SIGTERM stops it
  submit [--config F] [--nats URL] [--no-wait] [--follow] [--timeout D] [--format json|text] TASK
        publish TASK on NATS and print its result (exit status as run);
        --no-wait prints the task id instead; --follow writes the
        program's output to stderr as it runs
  result [--config F] [--nats URL] [--wait D] [--format json|text] ID
        print the result of task ID
  approve [--config F] [--nats URL] [--by NAME] ID yes|no
        decide the request held for approval ID by a worker (the id its
        webhook announced); says whether a worker took the decision
  sessions [--config F] [--json] new|ls|rm ID|files ID|cat ID PATH|put ID PATH
        kept session workspaces: create one (prints its id, for a task's
        "session" with "keep_workspace": true), list, remove, list or read
        or write its files
  sandbox [--server ADDR] [--json] create|ls|exec ID -- CMD...|ps ID|kill ID PID|rm ID
        live sandboxes on agentrun serve (--server, $AGENTRUN_SERVER, else
        the config's server.listen; token from $AGENTRUN_TOKEN): create one
        (--image, --allow HOST, --timeout D; prints its id), list them, run
        a command in one (its output here, its exit status ours), list its
        processes, signal one (--signal S, default SIGTERM), end it
  shell [--server ADDR] [--image I] [--allow HOST]... [--timeout D]
        [--session ID] [--tool T]...
        an interactive shell (bash if the image has it, else /bin/sh) on
        this terminal in a new live sandbox on serve, ended with it
        (Ctrl-D or exit), as docker run -it --rm gives
  mcp [--server ADDR | [--local] --config F]
        serve the MCP tool run_code over stdio: forwarded to agentrun serve
        (--server, $AGENTRUN_SERVER, else the config's server.listen), or,
        as root with no server there (or with --local), run here; says
        which on stderr
  doctor [--config F]
        check this host; exits 1 if a run would fail
  gc [--config F]
        remove what agentrun processes that died left behind (also done
        at the start of every run), sessions idle past sessions.ttl, and
        the runtimes' parent cgroups where empty (runs keep them)
  pull [--config F] [--store DIR] REF
        fetch and unpack image REF into the store; prints "REF DIGEST"
  images [--config F] [--store DIR] [--json]
        list the images in the store
  rmi [--config F] [--store DIR] REF...
        remove references from the store (and their images when unused)
  prune [--config F] [--store DIR]
        remove images no reference uses and what interrupted pulls left
  version
        print the version, the commit and the libcontainer and runsc versions
        it was built with
  help  show this help

exit status of run, and the result's exit_code on every door: the program's
own exit code (128+n for signal n); 124 timeout; 137 OOM kill; 125 agentrun
could not run the task (error says why).
`

func main() {
	logrus.SetOutput(os.Stderr)
	logrus.SetLevel(logrus.WarnLevel)
	os.Exit(dispatch(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func dispatch(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdin, stdout, stderr)
	case "serve":
		return cmdServe(args[1:], stderr)
	case "worker":
		return cmdWorker(args[1:], stderr)
	case "submit":
		return cmdSubmit(args[1:], stdin, stdout, stderr)
	case "result":
		return cmdResult(args[1:], stdout, stderr)
	case "approve":
		return cmdApprove(args[1:], stdout, stderr)
	case "sessions":
		return cmdSessions(args[1:], stdin, stdout, stderr)
	case "sandbox":
		return cmdSandbox(args[1:], stdout, stderr)
	case "shell":
		return cmdShell(args[1:], os.Stdin, stdout, stderr)
	case "mcp":
		return cmdMCP(args[1:], stderr)
	case "doctor":
		return cmdDoctor(args[1:], stdout, stderr)
	case "gc":
		return cmdGC(args[1:], stdout, stderr)
	case "pull":
		return cmdPull(args[1:], stdout, stderr)
	case "images":
		return cmdImages(args[1:], stdout, stderr)
	case "rmi":
		return cmdRmi(args[1:], stdout, stderr)
	case "prune":
		return cmdPrune(args[1:], stdout, stderr)
	case "version", "--version":
		return cmdVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	// A task file (or -) with no command word, with run's flags before or
	// after it.
	if first := args[0]; first == "-" || fileExists(first) || strings.HasPrefix(first, "-") {
		return cmdRun(args, stdin, stdout, stderr)
	}
	fmt.Fprintf(stderr, "agentrun: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
