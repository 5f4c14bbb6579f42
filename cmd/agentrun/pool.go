package main

import (
	"context"
	"fmt"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
)

// poolSeeds are the plans the pool starts with, per image of
// server.pool: the shape of a default task of the image. The placeholder
// code is never run, only its file name counts. The config's own image is
// the default of a task that names none (and so not bound by
// policy.local_images).
func poolSeeds(cfg *config.Config) (map[string]*task.Plan, error) {
	seeds := map[string]*task.Plan{}
	for ref, e := range cfg.Server.Pool {
		if e.Count == 0 {
			continue
		}
		seedTask := &task.Task{Image: ref, Code: "pass"}
		if ref == cfg.Image {
			seedTask.Image = ""
		}
		seed, err := seedTask.Resolve(cfg)
		if err != nil {
			return nil, fmt.Errorf("server.pool[%q]: %w", ref, err)
		}
		seeds[ref] = seed
	}
	return seeds, nil
}

// seedPool seeds pool with the images of cfg's server.pool; serve, its
// reload and worker share it. A pool image that policy refuses is an
// error. One that cannot be had now (a registry down) does not stop the
// caller: the pool goes on without sandboxes for it, the reason is logged
// and returned by image, and runs of that image pull it as usual. ctx
// bounds the pulls.
func seedPool(ctx context.Context, cfg *config.Config, pool *runner.Pool, logf func(string, ...any)) (map[string]string, error) {
	seeds, err := poolSeeds(cfg)
	if err != nil {
		return nil, err
	}
	failed := map[string]string{}
	for ref, seed := range seeds {
		if err := pool.Seed(ctx, seed); err != nil {
			logf("server.pool[%q]: %v; going on without it", ref, err)
			failed[ref] = err.Error()
		}
	}
	return failed, nil
}
