package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/agentrun/agentrun/internal/audit"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runner"
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
	serverAddr := fs.String("server", os.Getenv("AGENTRUN_SERVER"), "run on this agentrun serve (unix:///path or tcp://host:port; token from $AGENTRUN_TOKEN) instead of here")
	if err := fs.Parse(args); err != nil {
		return result.ExitSetup
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "agentrun run: exactly one task file (or -) is required")
		return result.ExitSetup
	}
	if *format != "json" && *format != "text" {
		fmt.Fprintf(stderr, "agentrun run: --format must be json or text, not %q\n", *format)
		return result.ExitSetup
	}

	var res *result.Result
	if *serverAddr != "" {
		if *cfgPath != "" || *auditPath != "" || *storeDir != "" {
			fmt.Fprintln(stderr, "agentrun run: --config, --audit and --store are the server's own with --server")
			return result.ExitSetup
		}
		res = runOnServer(*serverAddr, os.Getenv("AGENTRUN_TOKEN"), fs.Arg(0), stdin)
	} else {
		res = runTask(fs.Arg(0), *cfgPath, *auditPath, *storeDir, stdin, stderr)
	}

	out := stdout
	if *output != "" {
		f, err := os.OpenFile(*output, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			fmt.Fprintf(stderr, "agentrun run: %v\n", err)
			return result.ExitSetup
		}
		defer f.Close()
		out = f
	}
	if err := writeResult(out, res, *format); err != nil {
		fmt.Fprintf(stderr, "agentrun run: writing result: %v\n", err)
		return result.ExitSetup
	}
	if res.Error != "" && *format == "json" && *output == "" {
		fmt.Fprintf(stderr, "agentrun: %s\n", strings.Join(strings.Fields(res.Error), " "))
	}
	return res.ExitStatus()
}

// failed is the result of a task agentrun could not run.
func failed(err error) *result.Result {
	return &result.Result{Error: err.Error(), Files: map[string]result.File{},
		Network: result.Network{Allowed: []result.Allowed{}, Denied: []result.Denied{}, Failed: []result.Failed{}}}
}

// runOnServer sends the task to an agentrun server and returns its result.
// Ctrl-C or SIGTERM drops the request, which cancels the run there.
func runOnServer(addr, token, taskPath string, stdin io.Reader) *result.Result {
	c, err := server.NewClient(addr, token)
	if err != nil {
		return failed(err)
	}
	data, err := readTask(taskPath, stdin)
	if err != nil {
		return failed(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := c.Run(ctx, data)
	if err != nil {
		return failed(err)
	}
	return res
}

// runTask loads the config and the task and runs it. Whatever fails, it
// returns a result (with Error set when agentrun could not run the task).
func runTask(taskPath, cfgPath, auditPath, storeDir string, stdin io.Reader, stderr io.Writer) *result.Result {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return failed(err)
	}
	if storeDir != "" {
		cfg.StoreDir = storeDir
	}
	data, err := readTask(taskPath, stdin)
	if err != nil {
		return failed(err)
	}
	plan, err := task.Load(data, cfg)
	if err != nil {
		return failed(err)
	}
	if auditPath == "" {
		auditPath = cfg.Audit
	}
	log, err := audit.Open(auditPath)
	if err != nil {
		return failed(err)
	}
	defer log.Close()
	r, err := runner.New(cfg, log)
	if err != nil {
		return failed(err)
	}
	if _, err := r.GC(); err != nil {
		fmt.Fprintf(stderr, "agentrun: gc: %v\n", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return r.Run(ctx, plan)
}

func readTask(path string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("reading task: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, task.MaxTaskBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading task: %w", err)
	}
	return data, nil
}

func writeResult(w io.Writer, res *result.Result, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	var b strings.Builder
	b.WriteString(res.Stdout)
	if res.Stderr != "" {
		b.WriteString(res.Stderr)
	}
	fmt.Fprintf(&b, "\n[agentrun %s] %s\n", res.ID, summary(res))
	_, err := io.WriteString(w, b.String())
	return err
}

func summary(res *result.Result) string {
	var parts []string
	switch {
	case res.Error != "":
		parts = append(parts, "error: "+res.Error)
	case res.TimedOut:
		parts = append(parts, "timed out")
	case res.OOMKilled:
		parts = append(parts, "killed: out of memory")
	case res.Signal != "":
		parts = append(parts, "killed by "+res.Signal)
	default:
		parts = append(parts, fmt.Sprintf("exit %d", res.ExitCode))
	}
	parts = append(parts, fmt.Sprintf("%d ms", res.DurationMS), fmt.Sprintf("cpu %d ms", res.CPUMS),
		fmt.Sprintf("peak %.1f MiB", float64(res.MemoryPeakBytes)/(1<<20)))
	if res.StdoutTruncated || res.StderrTruncated {
		parts = append(parts, fmt.Sprintf("output truncated (%d+%d bytes written)", res.StdoutBytes, res.StderrBytes))
	}
	return strings.Join(parts, ", ")
}
