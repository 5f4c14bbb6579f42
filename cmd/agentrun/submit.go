package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/worker"
)

// busFlags are the flags submit and result share.
type busFlags struct {
	cfgPath, natsURL, format *string
}

func newBusFlags(fs *flag.FlagSet) busFlags {
	return busFlags{
		cfgPath: fs.String("config", "", "config file whose worker section names NATS (default "+config.DefaultPath+")"),
		natsURL: fs.String("nats", os.Getenv("AGENTRUN_NATS"), "NATS server URL(s), comma-separated, instead of the config's worker.nats (also $AGENTRUN_NATS)"),
		format:  fs.String("format", "json", "result format: json, or text (program output and a summary)"),
	}
}

// connect loads the config and connects to its NATS (or --nats).
func (b busFlags) connect(name string) (*config.Config, *nats.Conn, jetstream.JetStream, error) {
	if *b.format != "json" && *b.format != "text" {
		return nil, nil, nil, fmt.Errorf("--format must be json or text, not %q", *b.format)
	}
	cfg, err := config.Load(*b.cfgPath)
	if err != nil {
		return nil, nil, nil, err
	}
	if *b.natsURL != "" {
		cfg.Worker.NATS = strings.Split(*b.natsURL, ",")
		if err := cfg.Validate(); err != nil {
			return nil, nil, nil, fmt.Errorf("--nats: %w", err)
		}
	}
	nc, err := worker.Connect(cfg.Worker, name)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return cfg, nc, js, nil
}

// print writes res as run does and returns run's exit status for it.
func (b busFlags) print(stdout, stderr io.Writer, res *result.Result) int {
	if err := writeResult(stdout, stderr, res, *b.format); err != nil {
		fmt.Fprintf(stderr, "agentrun: writing result: %v\n", err)
		return result.ExitSetup
	}
	if res.Error != "" && *b.format == "json" {
		fmt.Fprintf(stderr, "agentrun: %s\n", strings.Join(strings.Fields(res.Error), " "))
	}
	return res.ExitStatus()
}

func cmdSubmit(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	b := newBusFlags(fs)
	noWait := fs.Bool("no-wait", false, "print the task id and exit once the stream has the task")
	follow := fs.Bool("follow", false, "write the program's output to stderr as it runs (worker.events)")
	wait := fs.Duration("timeout", 0, "give up waiting for the result after this long (0: wait until interrupted)")
	if err := fs.Parse(args); err != nil {
		return result.ExitSetup
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "agentrun submit: exactly one task file (or -) is required")
		return result.ExitSetup
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *wait)
		defer cancel()
	}
	var live io.Writer
	if *follow && !*noWait {
		live = stderr
	}
	id, res := submit(ctx, b, fs.Arg(0), stdin, *noWait, live)
	if *noWait && res == nil {
		fmt.Fprintln(stdout, id)
		return 0
	}
	return b.print(stdout, stderr, res)
}

// submit publishes the task and, unless noWait, waits for its result,
// writing its live output to live when not nil. Whatever fails, it returns
// a result with Error set.
func submit(ctx context.Context, b busFlags, taskPath string, stdin io.Reader, noWait bool, live io.Writer) (string, *result.Result) {
	data, err := readTask(taskPath, stdin)
	if err != nil {
		return "", result.NotRun(err)
	}
	id, err := worker.TaskID(data)
	if err != nil {
		return "", result.NotRun(err)
	}
	cfg, nc, js, err := b.connect("agentrun submit")
	if err != nil {
		return id, result.NotRun(err)
	}
	defer nc.Close()
	if live != nil {
		sub, err := worker.Follow(nc, cfg.Worker, id, live)
		if err != nil {
			return id, result.NotRun(err)
		}
		defer sub.Unsubscribe()
	}
	if _, err := worker.Publish(ctx, js, cfg.Worker, id, data); err != nil {
		return id, result.NotRun(err)
	}
	if noWait {
		return id, nil
	}
	kv, err := worker.OpenBucket(ctx, js, cfg.Worker)
	if err != nil {
		return id, result.NotRun(err)
	}
	res, err := worker.Wait(ctx, kv, id)
	if err != nil {
		return id, result.NotRun(err)
	}
	return id, res
}

func cmdResult(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("result", flag.ContinueOnError)
	fs.SetOutput(stderr)
	b := newBusFlags(fs)
	wait := fs.Duration("wait", 0, "wait this long for a result not stored yet (0: do not wait)")
	if err := fs.Parse(args); err != nil {
		return result.ExitSetup
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "agentrun result: exactly one task id is required")
		return result.ExitSetup
	}
	return b.print(stdout, stderr, fetchResult(b, fs.Arg(0), *wait))
}

// fetchResult is the stored result of id, waiting up to wait for it.
func fetchResult(b busFlags, id string, wait time.Duration) *result.Result {
	cfg, nc, js, err := b.connect("agentrun result")
	if err != nil {
		return result.NotRun(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+wait)
	defer cancel()
	kv, err := worker.OpenBucket(ctx, js, cfg.Worker)
	if err != nil {
		return result.NotRun(err)
	}
	res, err := worker.Get(ctx, kv, id)
	if errors.Is(err, worker.ErrNoResult) && wait > 0 {
		wctx, wcancel := context.WithTimeout(ctx, wait)
		defer wcancel()
		res, err = worker.Wait(wctx, kv, id)
	}
	if err != nil {
		return result.NotRun(err)
	}
	return res
}
