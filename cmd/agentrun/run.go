package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/task"
)

func cmdRun(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (default "+config.DefaultPath+")")
	output := fs.String("output", "", "write the result to this file instead of stdout")
	format := fs.String("format", "json", "result format: json, or text (program output and a summary)")
	auditPath := fs.String("audit", "", `audit log ("-" for stderr; default from the config)`)
	storeDir := fs.String("store", "", "image store directory (default from the config)")
	serverAddr := fs.String("server", "", "run on this agentrun serve (unix:///path or tcp://host:port; default $AGENTRUN_SERVER; token from $AGENTRUN_TOKEN) instead of here")
	pos, ok := parseInterspersed(fs, args)
	if !ok {
		return result.ExitSetup
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "agentrun run: exactly one task file (or -) is required; got %d: %q\n", len(pos), pos)
		return result.ExitSetup
	}
	if *format != "json" && *format != "text" {
		fmt.Fprintf(stderr, "agentrun run: --format must be json or text, not %q\n", *format)
		return result.ExitSetup
	}
	fromEnv := false
	if *serverAddr == "" {
		*serverAddr, fromEnv = os.Getenv("AGENTRUN_SERVER"), true
	}
	if *serverAddr != "" && (*cfgPath != "" || *auditPath != "" || *storeDir != "") {
		if fromEnv {
			fmt.Fprintf(stderr, "agentrun run: AGENTRUN_SERVER is set (%s), so the task would run on that server, whose config, audit log and store are its own: unset AGENTRUN_SERVER to run here with --config, --audit or --store\n", *serverAddr)
		} else {
			fmt.Fprintln(stderr, "agentrun run: --config, --audit and --store are the server's own with --server")
		}
		return result.ExitSetup
	}
	// The result's file is opened before the run: a path that cannot be
	// written fails here, not after the task has run.
	out := stdout
	if *output != "" {
		f, err := os.OpenFile(*output, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			fmt.Fprintf(stderr, "agentrun run: --output: %v (the task was not run)\n", err)
			return result.ExitSetup
		}
		defer f.Close()
		out = f
	}

	var res *result.Result
	if *serverAddr != "" {
		res = runOnServer(*serverAddr, os.Getenv("AGENTRUN_TOKEN"), pos[0], stdin)
	} else {
		oneShotGC()
		oneShotProcs()
		if *format == "json" {
			go warmResultJSON()
		}
		var after func()
		res, after = runTask(pos[0], *cfgPath, *auditPath, *storeDir, stdin, stderr)
		defer after()
	}

	if err := writeResult(out, stderr, res, *format); err != nil {
		fmt.Fprintf(stderr, "agentrun run: writing result: %v\n", err)
		return result.ExitSetup
	}
	if res.Error != "" && *format == "json" && *output == "" {
		fmt.Fprintf(stderr, "agentrun: %s\n", strings.Join(strings.Fields(res.Error), " "))
	}
	return res.ExitStatus()
}

// warmResultJSON encodes an empty result, which builds encoding/json's
// encoders of every type a result holds (by reflection, once per type and
// process): done beside the run's set-up and program, it is not on the
// way from the program's end to the answer, where it took about 0.4 ms of
// a cold run.
func warmResultJSON() { _ = (&result.Result{}).WriteJSON(io.Discard) }

// parseInterspersed parses fs's flags wherever they are among args (so
// that flags may follow the task file) and returns the other arguments;
// everything after "--" is an argument.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, bool) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, false
		}
		consumed := args[:len(args)-fs.NArg()]
		if len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			return append(pos, fs.Args()...), true
		}
		if fs.NArg() == 0 {
			return pos, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// runOnServer sends the task to an agentrun server and returns its result.
// Ctrl-C or SIGTERM drops the request, which cancels the run there.
func runOnServer(addr, token, taskPath string, stdin io.Reader) *result.Result {
	c, err := server.NewClient(addr, token)
	if err != nil {
		return result.NotRun(err)
	}
	data, err := readTask(taskPath, stdin)
	if err != nil {
		return result.NotRun(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := c.Run(ctx, data)
	if err != nil {
		return result.NotRun(err)
	}
	return res
}

// runTask loads the config and the task and runs it. Whatever fails, it
// returns a result (with Error set when agentrun could not run the task),
// and what is left to do once the result is written: the run launcher's
// bytecode made if the run missed it (once per image and interpreter, for
// the cold runs after this one), then the runner and its log closed.
// oneShotGCPercent is the GC target of a run in this process: a cold
// run's set-up allocates about 8 MiB (the config, the plan, libcontainer's
// parent side), which Go's default target collects twice from its 4 MiB
// floor, about 4 ms of CPU in a run that lasts 60; at 400 the floor is
// 16 MiB and a print(45) collects never. The heap may then grow to five
// times what is live instead of twice: the output kept (output_bytes per
// stream) is the only part of it that grows with the program.
const oneShotGCPercent = 400

// oneShotGC sets oneShotGCPercent, unless the operator set GOGC.
func oneShotGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(oneShotGCPercent)
	}
}

// oneShotProcs starts a one-shot run's container init on one P
// (libcontainer passes it this process's GOMAXPROCS), unless the operator
// set GOMAXPROCS: libcontainer's init sets one P itself
// (runtime.GOMAXPROCS(1) in its Init, a stop of the world) after a start
// with as many as the sandbox's CPUs. The CLI keeps its own: what it does
// beside its main goroutine (the encoders made ahead, the container's
// removal beside the unmounts) runs at once on a second one, where on one
// it waited for the main goroutine to block (0.97x and 0.99x a cold run's
// wall time against one P, in two sittings of 50). runsc and tool servers
// get environments of their own.
func oneShotProcs() {
	if os.Getenv("GOMAXPROCS") == "" {
		os.Setenv("GOMAXPROCS", "1")
	}
}

func runTask(taskPath, cfgPath, auditPath, storeDir string, stdin io.Reader, stderr io.Writer) (*result.Result, func()) {
	none := func() {}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return result.NotRun(err), none
	}
	if storeDir != "" {
		cfg.StoreDir = storeDir
	}
	data, err := readTask(taskPath, stdin)
	if err != nil {
		return result.NotRun(err), none
	}
	plan, err := task.Load(data, cfg)
	if err != nil {
		return result.NotRun(err), none
	}
	if auditPath == "" {
		auditPath = cfg.Audit
	}
	r, closeLog, err := openRunner(cfg, auditPath, func(format string, args ...any) {
		fmt.Fprintf(stderr, "agentrun: "+format+"\n", args...)
	})
	if err != nil {
		return result.NotRun(err), none
	}
	r.MakeLauncherCodeAfter()
	// SIGINT or SIGTERM cancels the run, and the compiles after it. The
	// process exits once they are done: its end drops the handler, which
	// stop (signal.Stop) would drop first, waiting for the runtime's
	// signal goroutine to go idle, some 0.4 ms of every run's exit.
	ctx, _ := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var hooks runapi.Hooks
	if len(plan.Services) > 0 {
		hooks.Approve = terminalApprover()
	}
	res := r.Run(ctx, plan, hooks)
	return res, func() {
		r.MakeMissedLauncherCode(ctx)
		closeLog()
	}
}

// readTask reads the task file (or stdin for "-"), refusing one larger
// than task.MaxTaskBytes by its own size, not the size read.
func readTask(path string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	name := "the task on stdin"
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("reading task: %w", err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() > task.MaxTaskBytes {
			return nil, fmt.Errorf("task file %s is %d bytes, more than the maximum %d (32 MiB)", path, st.Size(), task.MaxTaskBytes)
		}
		r, name = f, "task file "+path
	}
	data, err := io.ReadAll(io.LimitReader(r, task.MaxTaskBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading task: %w", err)
	}
	if len(data) > task.MaxTaskBytes {
		return nil, fmt.Errorf("%s is more than the maximum %d bytes (32 MiB)", name, task.MaxTaskBytes)
	}
	return data, nil
}

// writeResult writes res in format (json or text): the result, or the
// program's output, to out; in text mode its summary to errw.
func writeResult(out, errw io.Writer, res *result.Result, format string) error {
	if format == "json" {
		return res.WriteJSON(out)
	}
	return res.WriteText(out, errw)
}
