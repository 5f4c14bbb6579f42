package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/worker"
)

func cmdWorker(args []string, stderr io.Writer) int {
	cfg, code := loadConfig("worker", args, stderr)
	if cfg == nil {
		return code
	}
	if err := runWorker(cfg, stderr); err != nil {
		fmt.Fprintf(stderr, "agentrun worker: %v\n", err)
		return 1
	}
	return 0
}

// runWorker takes tasks from NATS until SIGTERM or SIGINT, then stops
// taking them, lets the tasks running finish (killing them after the
// policy's longest timeout) and empties the warm pool.
func runWorker(cfg *config.Config, stderr io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "agentrun worker: "+format+"\n", args...) }
	if err := approvals.CheckSecret("worker.approvals", cfg.Worker.Approvals.WebhookSecretFile); err != nil {
		return err
	}
	r, closeLog, err := openRunner(cfg, cfg.Audit, logf)
	if err != nil {
		return err
	}
	defer closeLog()
	longLived(r, logf)
	stop, unnotify := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer unnotify()

	host, _ := os.Hostname()
	setup, cancel := context.WithTimeout(stop, 30*time.Second)
	w, err := worker.New(setup, cfg, r.Run, fmt.Sprintf("agentrun worker %s/%d", host, os.Getpid()))
	cancel()
	if err != nil {
		return err
	}
	w.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, "agentrun worker: "+format+"\n", args...) }

	pool := r.NewPool(cfg.Server.PoolSizes())
	r.UsePool(pool)
	defer func() {
		if err := pool.Close(); err != nil {
			w.Logf("%v", err)
		}
	}()
	pool.SetWarm(cfg)
	if _, err := runapi.SeedPool(stop, cfg, pool, w.Logf); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "agentrun worker: taking tasks from stream %s (%s), %d slots\n", cfg.Worker.Stream, cfg.Worker.Subject, w.Slots())
	longest := cfg.Policy.Timeout.Duration()
	err = w.Run(stop, longest+5*time.Second)
	fmt.Fprintf(stderr, "agentrun worker: stopped\n")
	return err
}
