package main

import (
	"errors"
	"fmt"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
)

// startPool starts the warm pool of server.pool on r, seeded with the
// shape of a default task of each image; nil when the config has none.
// serve and worker share it.
func startPool(cfg *config.Config, r *runner.Runner) (*runner.Pool, error) {
	if len(cfg.Server.Pool) == 0 {
		return nil, nil
	}
	pool := r.NewPool(cfg.Server.Pool)
	for ref, n := range cfg.Server.Pool {
		if n == 0 {
			continue
		}
		// The pool starts with the shape of a default task of the image;
		// the placeholder code is never run, only its file name counts.
		// The config's own image is the default of a task that names
		// none (and so not bound by policy.local_images).
		seedTask := fmt.Sprintf(`{"image":%q,"code":"pass"}`, ref)
		if ref == cfg.Image {
			seedTask = `{"code":"pass"}`
		}
		seed, err := task.Load([]byte(seedTask), cfg)
		if err == nil {
			err = pool.Seed(seed)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("server.pool[%q]: %w", ref, err), pool.Close())
		}
	}
	return pool, nil
}
