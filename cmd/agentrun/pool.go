package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
)

// startPool starts the warm pool of server.pool on r, seeded with the
// shape of a default task of each image; nil when the config has none.
// serve and worker share it. A pool image that policy refuses is an
// error; one that cannot be had now (a registry down) does not stop the
// caller: the pool starts without sandboxes for it, the reason is logged
// to stderr and returned by image, and runs of that image pull it as usual.
func startPool(cfg *config.Config, r *runner.Runner, stderr io.Writer) (*runner.Pool, map[string]string, error) {
	if len(cfg.Server.Pool) == 0 {
		return nil, nil, nil
	}
	pool := r.NewPool(cfg.Server.Pool)
	failed := map[string]string{}
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
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("server.pool[%q]: %w", ref, err), pool.Close())
		}
		if err := pool.Seed(seed); err != nil {
			fmt.Fprintf(stderr, "agentrun: server.pool[%q]: %v; starting without it\n", ref, err)
			failed[ref] = err.Error()
		}
	}
	return pool, failed, nil
}
