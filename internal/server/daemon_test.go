package server

import (
	"context"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// fakePool is a warm pool that keeps nothing and records its sizes.
type fakePool struct{ sizes map[string]int }

func (p *fakePool) Seed(context.Context, *task.Plan) error { return nil }
func (p *fakePool) Resize(sizes map[string]int)            { p.sizes = sizes }
func (p *fakePool) SetWarm(*config.Config)                 {}
func (p *fakePool) Stats() runapi.PoolStats                { return runapi.PoolStats{} }
func (p *fakePool) Close() error                           { return nil }

// TestDaemonReload: a reload applies what the runs that come next take
// and refuses what takes a restart, or a TCP socket's token removed,
// keeping the config before.
func TestDaemonReload(t *testing.T) {
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Server.Listen = config.Addr{Network: "tcp", Address: "127.0.0.1:0"}
	cfg.Server.Token = "s3cret"
	pool := &fakePool{}
	d := &Daemon{cfg: cfg, api: New(cfg, okRun, nil), pool: pool}

	for _, c := range []struct {
		name    string
		mutate  func(*config.Config)
		wantErr string
	}{
		{"listen", func(c *config.Config) { c.Server.Listen.Address = "127.0.0.1:1" }, "server.listen changed, which takes a restart"},
		{"dirs", func(c *config.Config) { c.StateDir, c.StoreDir = "/a", "/b" }, "state_dir, store_dir changed, which takes a restart"},
		{"token", func(c *config.Config) { c.Server.Token = "" }, "server.listen is tcp: server.token may not be removed"},
	} {
		next := *cfg
		c.mutate(&next)
		applied, err := d.reload(&next)
		if applied || err == nil || err.Error() != c.wantErr {
			t.Errorf("%s: applied %v, %v; want refused with %q", c.name, applied, err, c.wantErr)
		}
		if d.cfg != cfg || d.api.cfg.Load() != cfg {
			t.Errorf("%s: the config changed after a refused reload", c.name)
		}
	}

	next := *cfg
	next.Server.MaxConcurrent = cfg.Server.MaxConcurrent + 3
	next.Server.Token = "n3w"
	if applied, err := d.reload(&next); !applied || err != nil {
		t.Fatalf("reload of max_concurrent and token: applied %v, %v", applied, err)
	}
	if d.cfg != &next || d.api.cfg.Load() != &next || cap(*d.api.slots.Load()) != next.Server.MaxConcurrent {
		t.Error("the reloaded config is not the server's")
	}
	if pool.sizes == nil {
		t.Error("the pool was not resized")
	}
}
