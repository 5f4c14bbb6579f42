package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/runc"
)

func init() {
	// The in-process pool contender's containers re-execute this binary
	// as their init.
	runc.InitHook()
}

// poolContender runs print(45) through a runner whose pool keeps one
// sandbox of the task's shape ready. Each timed run takes a ready sandbox;
// between runs, untimed, the pool refills, so that the refill does not
// compete with the next contender. It returns the contender and a func
// that closes the pool.
func poolContender(work, rootfs string) (*contender, func()) {
	c := &contender{name: "agentrun warm pool", note: "a sandbox prepared ahead (container init waiting at exec), in this process as `serve` runs it: timed to the result, which serve answers before the tear-down"}
	cfg := config.Default()
	cfg.Image = "dir:" + rootfs
	cfg.Audit = ""
	cfg.StateDir = filepath.Join(work, "pool-state")
	cfg.StoreDir = filepath.Join(work, "pool-store")
	cfg.Policy.LocalImages = []string{filepath.Dir(filepath.Dir(rootfs))}
	r, err := runner.New(cfg, nil)
	if err != nil {
		c.err = err.Error()
		return c, func() {}
	}
	plan, err := task.Load([]byte(`{"code":"print(45)"}`), cfg)
	if err != nil {
		c.err = err.Error()
		return c, func() {}
	}
	pool := r.NewPool(map[string]int{cfg.Image: 1})
	if err := pool.Seed(plan); err != nil {
		c.err = err.Error()
	}
	c.call = func(int) (time.Duration, string, error) {
		if err := waitReady(pool, cfg.Image); err != nil {
			return 0, "", err
		}
		// Timed to the result, as serve answers: before the tear-down.
		var el time.Duration
		start := time.Now()
		res := r.RunReport(context.Background(), plan, func(*result.Result) { el = time.Since(start) })
		if res.Error != "" {
			return 0, "", errors.New(res.Error)
		}
		// Refill before the next contender runs, untimed.
		if err := waitReady(pool, cfg.Image); err != nil {
			return 0, "", err
		}
		return el, res.Stdout, nil
	}
	return c, func() { _ = pool.Close() }
}

func waitReady(pool *runner.Pool, image string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := pool.Stats()
		if st.Ready[image] > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no pooled sandbox within 30s: %s", st.LastErr)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
