package runapi

import (
	"context"
	"fmt"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/task"
)

// Pool is the runner's warm pool as serve and the worker keep it: seeded
// with the images of server.pool, resized and re-seeded by a reload, and
// emptied at the end. The runner's *Pool is one.
type Pool interface {
	// Seed keeps sandboxes ready for plans of plan's shape; ctx bounds
	// the pull of its image.
	Seed(ctx context.Context, plan *task.Plan) error
	// Resize sets how many sandboxes are kept ready per image.
	Resize(sizes map[string]int)
	// SetWarm takes the warm settings of cfg's server.pool.
	SetWarm(cfg *config.Config)
	// Stats is what the pool holds.
	Stats() PoolStats
	// Close removes the pool's sandboxes.
	Close() error
}

// PoolSeeds are the plans the pool starts with, per image of
// server.pool: the shape of a default task of the image. The placeholder
// code is never run, only its file name counts. The config's own image is
// the default of a task that names none (and so not bound by
// policy.local_images).
func PoolSeeds(cfg *config.Config) (map[string]*task.Plan, error) {
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

// SeedPool seeds pool with the images of cfg's server.pool; serve, its
// reload and the worker share it. A pool image that policy refuses is an
// error. One that cannot be had now (a registry down) does not stop the
// caller: the pool goes on without sandboxes for it, the reason is logged
// and returned by image, and runs of that image pull it as usual. ctx
// bounds the pulls.
func SeedPool(ctx context.Context, cfg *config.Config, pool Pool, logf func(string, ...any)) (map[string]string, error) {
	seeds, err := PoolSeeds(cfg)
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
