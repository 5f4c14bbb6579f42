package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/result"
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

// fakeDoor is a door that records the configs it is given.
type fakeDoor struct{ cfg *config.Config }

func (d *fakeDoor) HTTPHandler() http.Handler      { return http.NotFoundHandler() }
func (d *fakeDoor) Shutdown(context.Context)       {}
func (d *fakeDoor) Close()                         {}
func (d *fakeDoor) Reload(cfg *config.Config)      { d.cfg = cfg }
func (d *fakeDoor) reloaded(c *config.Config) bool { return d.cfg == c }

// reloadBase is the config the reload tests start from: a TCP socket
// with a token, one run at a time, tool server "old".
func reloadBase() *config.Config {
	cfg := config.Default()
	cfg.Image = "dir:/nonexistent"
	cfg.Policy.LocalImages = []string{"/nonexistent"}
	cfg.Server.Listen = config.Addr{Network: "tcp", Address: "127.0.0.1:0"}
	cfg.Server.Token = "s3cret"
	cfg.Server.MaxConcurrent = 1
	cfg.Tools = config.Tools{"old": {URL: "http://127.0.0.1:1/mcp", Rules: []config.ToolRule{{Tools: []string{"*"}}}}}
	return cfg
}

// reloaded is a daemon serving its API, whose runs record their plans
// and hooks; a run of code "block" waits until the test ends.
type reloaded struct {
	d         *Daemon
	pool      *fakePool
	door      *fakeDoor
	e2b       *fakeDoor
	sandboxes *fakeSandboxes
	url       string
	token     string

	mu    sync.Mutex
	plans []*task.Plan
	hooks []runapi.Hooks
}

func newReloaded(t *testing.T, cfg *config.Config) *reloaded {
	t.Helper()
	h := &reloaded{pool: &fakePool{}, door: &fakeDoor{}, e2b: &fakeDoor{}, sandboxes: &fakeSandboxes{}, token: cfg.Server.Token}
	release := make(chan struct{})
	run := func(ctx context.Context, p *task.Plan, hooks runapi.Hooks) *result.Result {
		h.mu.Lock()
		h.plans, h.hooks = append(h.plans, p), append(h.hooks, hooks)
		h.mu.Unlock()
		if string(p.Code) == "block" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return &result.Result{ID: "ar-r"}
	}
	api := New(cfg, run, nil)
	api.Sandboxes = h.sandboxes
	h.d = &Daemon{cfg: cfg, api: api, pool: h.pool, door: h.door, e2b: h.e2b}
	ts := httptest.NewServer(api.Handler())
	t.Cleanup(func() { close(release); ts.Close() })
	h.url = ts.URL
	return h
}

// do sends method path with body, the token and headers hdr, and
// returns the answer's status.
func (h *reloaded) do(t *testing.T, method, path, body string, hdr map[string]string) int {
	t.Helper()
	all := map[string]string{"Authorization": "Bearer " + h.token}
	for k, v := range hdr {
		all[k] = v
	}
	return send(t, method, h.url+path, "application/json", body, all)
}

// post runs taskJSON, wanting status want, and returns the plan its run
// got (nil when it was refused).
func (h *reloaded) post(t *testing.T, taskJSON string, want int) *task.Plan {
	t.Helper()
	h.mu.Lock()
	n := len(h.plans)
	h.mu.Unlock()
	if got := h.do(t, "POST", "/v1/runs", taskJSON, nil); got != want {
		t.Fatalf("POST %s: status %d, want %d", taskJSON, got, want)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.plans) == n {
		return nil
	}
	return h.plans[n]
}

// TestReloadAppliesEachReloadableKey: for every row of
// config.ReloadTable that a reload applies, a reload that changes it
// alone is applied, and its effect is seen where serve reads it: the
// API's answers, the plan a run gets (which the runner takes tools,
// tool_limits and the image's standing from), the pool, the door. A row
// without a case here fails the test.
func TestReloadAppliesEachReloadableKey(t *testing.T) {
	cases := map[string]struct {
		mutate func(*config.Config)
		check  func(t *testing.T, h *reloaded)
	}{
		"image": {func(c *config.Config) { c.Image = "registry.example/new:1" }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1"}`, 200); p.Image != "registry.example/new:1" || !p.OwnImage {
				t.Errorf("plan's image %q (own %v), want the new default, the config's own", p.Image, p.OwnImage)
			}
		}},
		"language": {func(c *config.Config) { c.Language = "sh" }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1"}`, 200); p.Argv[0] != "sh" {
				t.Errorf("plan's argv %v, want sh's", p.Argv)
			}
		}},
		"limits": {func(c *config.Config) { c.Limits.Timeout = config.MustDuration("7s") }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1"}`, 200); p.Limits.Timeout != 7*time.Second {
				t.Errorf("plan's timeout %v, want 7s", p.Limits.Timeout)
			}
		}},
		"env": {func(c *config.Config) { c.Env = map[string]string{"RELOADED": "1"} }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1"}`, 200); p.Env["RELOADED"] != "1" {
				t.Errorf("plan's env %v, want RELOADED=1", p.Env)
			}
		}},
		"runtime": {func(c *config.Config) { c.Runtime = config.RuntimeRunsc }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1"}`, 200); p.Runtime != config.RuntimeRunsc {
				t.Errorf("plan's runtime %q, want runsc", p.Runtime)
			}
		}},
		"policy": {func(c *config.Config) {
			c.Policy.Memory = config.MustSize("200m")
			c.Policy.AllowNetwork = new(bool)
			c.Policy.LocalImages = []string{"/reloaded"}
		}, func(t *testing.T, h *reloaded) {
			h.post(t, `{"code": "1", "limits": {"memory": "256m"}}`, 403)
			h.post(t, `{"code": "1", "network": {"allow": ["example.com"]}}`, 403)
			h.post(t, `{"code": "1", "image": "dir:/nonexistent/x"}`, 403)
			h.post(t, `{"code": "1", "image": "dir:/reloaded/x", "limits": {"memory": "128m"}}`, 200)
		}},
		"languages": {func(c *config.Config) { c.Languages["ruby"] = []string{"ruby", "{file}"} }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1", "language": "ruby"}`, 200); p.Argv[0] != "ruby" {
				t.Errorf("plan's argv %v, want ruby's", p.Argv)
			}
		}},
		"tools": {func(c *config.Config) {
			c.Tools = config.Tools{"ev": {URL: "http://127.0.0.1:2/mcp", Rules: []config.ToolRule{{Tools: []string{"echo"}, Approve: true}}}}
		}, func(t *testing.T, h *reloaded) {
			h.post(t, `{"code": "1", "tools": ["old"]}`, 403)
			p := h.post(t, `{"code": "1", "tools": ["ev"]}`, 200)
			if ev, ok := p.ToolServers["ev"]; !ok || len(p.ToolServers) != 1 || len(ev.Rules) != 1 || !ev.Rules[0].Approve {
				t.Errorf("plan's tool servers %+v, want the new ev alone, its echo held", p.ToolServers)
			}
		}},
		"tool_limits": {func(c *config.Config) { c.ToolLimits.Calls = 1 }, func(t *testing.T, h *reloaded) {
			if p := h.post(t, `{"code": "1", "tools": ["old"]}`, 200); p.ToolLimits.Calls != 1 {
				t.Errorf("plan's tool limits %+v, want 1 call", p.ToolLimits)
			}
		}},
		"server.max_concurrent": {func(c *config.Config) { c.Server.MaxConcurrent = 2; c.Server.Queue = 0 }, func(t *testing.T, h *reloaded) {
			h.block(t)
			h.post(t, `{"code": "1"}`, 200) // the second slot
		}},
		"server.queue": {func(c *config.Config) { c.Server.Queue = 0 }, func(t *testing.T, h *reloaded) {
			h.block(t)
			h.post(t, `{"code": "1"}`, 503) // no place to wait
		}},
		"server.quota": {func(c *config.Config) { c.Server.Quota.RunsPerMinute = 1 }, func(t *testing.T, h *reloaded) {
			h.post(t, `{"code": "1", "session": "q"}`, 200)
			h.post(t, `{"code": "1", "session": "q"}`, 429)
		}},
		"server.pool": {func(c *config.Config) { c.Server.Pool = map[string]config.PoolEntry{c.Image: {Count: 2}} }, func(t *testing.T, h *reloaded) {
			if h.pool.sizes["dir:/nonexistent"] != 2 {
				t.Errorf("pool sizes %v, want 2 of the image", h.pool.sizes)
			}
		}},
		"server.token": {func(c *config.Config) { c.Server.Token = "n3w" }, func(t *testing.T, h *reloaded) {
			if got := h.do(t, "GET", "/healthz", "", nil); got != 401 {
				t.Errorf("the old token: %d, want 401", got)
			}
			h.token = "n3w"
			if got := h.do(t, "GET", "/healthz", "", nil); got != 200 {
				t.Errorf("the new token: %d, want 200", got)
			}
		}},
		"server.approvals": {func(c *config.Config) { c.Server.Approvals.Page = true }, func(t *testing.T, h *reloaded) {
			if got := h.do(t, "GET", "/ui/approvals", "", nil); got == 404 {
				t.Error("the approvals page is still off")
			}
			h.post(t, `{"code": "1"}`, 200)
			if h.hooks[len(h.hooks)-1].Approve == nil {
				t.Error("a run's held requests are still denied at once: no approver")
			}
		}},
		"server.hosts": {func(c *config.Config) { c.Server.Hosts = []string{"reloaded.example"} }, func(t *testing.T, h *reloaded) {
			if got := h.do(t, "GET", "/healthz", "", map[string]string{"Host": "reloaded.example"}); got != 200 {
				t.Errorf("Host reloaded.example: %d, want 200", got)
			}
		}},
		"server.preview_domain": {func(c *config.Config) { c.Server.PreviewDomain = "preview.example" }, func(t *testing.T, h *reloaded) {
			// A sandbox's port by its name: no longer a foreign Host
			// (421), the port of a sandbox that is not there.
			if got := h.do(t, "GET", "/", "", map[string]string{"Host": "8000-sb-1.preview.example"}); got != 404 {
				t.Errorf("Host 8000-sb-1.preview.example: %d, want 404", got)
			}
		}},
		"sandboxes": {func(c *config.Config) {
			c.Sandboxes = config.Sandboxes{DefaultTimeout: config.MustDuration("2m"), MaxLifetime: config.MustDuration("30m"), Max: 3}
		}, func(t *testing.T, h *reloaded) {
			if got := h.do(t, "POST", "/v1/sandboxes", `{}`, nil); got != 201 {
				t.Fatalf("POST /v1/sandboxes: %d, want 201", got)
			}
			f := h.sandboxes
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.max != 3 || f.lifetime != 2*time.Minute || f.maxLifetime != 30*time.Minute {
				t.Errorf("sandboxes: max %d, a new one's lifetime %v of at most %v; want 3, 2m, 30m", f.max, f.lifetime, f.maxLifetime)
			}
		}},
		// The E2B door takes the new config (its own tests show it reads
		// the keys again and maps the templates anew).
		"e2b.templates": {func(c *config.Config) { c.E2B.Templates = map[string]string{"base": "dir:/reloaded/x"} }, func(t *testing.T, h *reloaded) {
			if !h.e2b.reloaded(h.d.cfg) {
				t.Error("the E2B door did not take the reloaded config")
			}
		}},
		"e2b.domain": {func(c *config.Config) { c.E2B.Domain = "e2b.example" }, func(t *testing.T, h *reloaded) {
			if !h.e2b.reloaded(h.d.cfg) {
				t.Error("the E2B door did not take the reloaded config")
			}
		}},
		"e2b.keys": {func(c *config.Config) { c.E2B.Keys = map[string]config.E2BKey{"alice": {File: "/reloaded/alice.key"}} }, func(t *testing.T, h *reloaded) {
			if !h.e2b.reloaded(h.d.cfg) {
				t.Error("the E2B door did not take the reloaded config")
			}
		}},
		"worker": {func(c *config.Config) { c.Worker.Slots = 5 }, func(t *testing.T, h *reloaded) {
			h.post(t, `{"code": "1"}`, 200)
		}},
	}
	for _, row := range config.ReloadTable {
		if row.Restart {
			continue
		}
		c, ok := cases[row.Key]
		if !ok {
			t.Errorf("config.ReloadTable's reloadable %q has no case here: show its effect after a reload", row.Key)
			continue
		}
		t.Run(row.Key, func(t *testing.T) {
			cfg := reloadBase()
			h := newReloaded(t, cfg)
			next := reloadBase()
			c.mutate(next)
			if keys := config.RestartOnly(cfg, next); len(keys) != 0 {
				t.Fatalf("the change also changes %v", keys)
			}
			if applied, err := h.d.reload(next); !applied || err != nil {
				t.Fatalf("reload: applied %v, %v", applied, err)
			}
			if h.d.cfg != next || h.d.api.cfg.Load() != next || !h.door.reloaded(next) {
				t.Fatal("the reloaded config is not the daemon's, the API's and the door's")
			}
			c.check(t, h)
		})
	}
}

// block starts a run that holds its slot until the test ends.
func (h *reloaded) block(t *testing.T) {
	t.Helper()
	req, err := http.NewRequest("POST", h.url+"/v1/runs", strings.NewReader(`{"code": "block"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+h.token)
	go func() {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); h.d.api.running.Load() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the blocking run never started")
		}
	}
}

// TestReloadRefusesEachRestartOnlyKey: for every row of
// config.ReloadTable that only a restart applies, a reload that changes
// it, even beside keys a reload applies, is refused as a whole with a
// message naming the key, and the daemon, the API and the door keep the
// config before. A row without a case here fails the test.
func TestReloadRefusesEachRestartOnlyKey(t *testing.T) {
	reg, err := endpoint.ParseRegistry("registry.example")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(*config.Config){
		"policy.registries": func(c *config.Config) { c.Policy.Registries = append(c.Policy.Registries, reg) },
		"network":           func(c *config.Config) { c.Network.ApprovalTimeout = config.MustDuration("5s") },
		"runsc":             func(c *config.Config) { c.Runsc.Flags = nil },
		"init":              func(c *config.Config) { c.Init = "/other/init" },
		"seccomp_helper":    func(c *config.Config) { c.SeccompHelper = config.SeccompHelperOff },
		"server.listen":     func(c *config.Config) { c.Server.Listen.Address = "127.0.0.1:1" },
		"sessions":          func(c *config.Config) { c.Sessions.Max++ },
		"store_dir":         func(c *config.Config) { c.StoreDir = "/b" },
		"store_max_size":    func(c *config.Config) { c.StoreMax = config.MustSize("1g") },
		"state_dir":         func(c *config.Config) { c.StateDir = "/a" },
		"cgroup_parent":     func(c *config.Config) { c.CgroupParent = "/other" },
		"run_uids":          func(c *config.Config) { c.RunUIDs.First++ },
		"audit":             func(c *config.Config) { c.Audit = "-" },
	}
	for _, row := range config.ReloadTable {
		if !row.Restart {
			continue
		}
		mutate, ok := cases[row.Key]
		if !ok {
			t.Errorf("config.ReloadTable's restart-only %q has no case here: show that a reload changing it is refused", row.Key)
			continue
		}
		t.Run(row.Key, func(t *testing.T) {
			cfg := reloadBase()
			h := newReloaded(t, cfg)
			next := reloadBase()
			next.ToolLimits.Calls = 1 // reloadable, refused with the rest
			mutate(next)
			applied, err := h.d.reload(next)
			if applied || err == nil || !strings.Contains(err.Error(), row.Key) || !strings.HasSuffix(err.Error(), "changed, which takes a restart") {
				t.Errorf("reload: applied %v, %v; want refused naming %s", applied, err, row.Key)
			}
			if h.d.cfg != cfg || h.d.api.cfg.Load() != cfg || h.door.cfg != nil || h.pool.sizes != nil {
				t.Error("the config changed after a refused reload")
			}
			if p := h.post(t, `{"code": "1", "tools": ["old"]}`, 200); p.ToolLimits.Calls != 0 {
				t.Errorf("a run after the refused reload has tool limits %+v, the refused config's", p.ToolLimits)
			}
		})
	}
}

// TestDaemonReloadRefusals: a config that names several restart-only
// keys names them all; one that removes a TCP socket's token is refused.
func TestDaemonReloadRefusals(t *testing.T) {
	cfg := reloadBase()
	h := newReloaded(t, cfg)
	for _, c := range []struct {
		name    string
		mutate  func(*config.Config)
		wantErr string
	}{
		{"dirs", func(c *config.Config) { c.StateDir, c.StoreDir, c.Network.Hosts = "/a", "/b", nil }, "store_dir, state_dir changed, which takes a restart"},
		{"network", func(c *config.Config) { c.Network.CAFiles = []string{"/ca.pem"} }, "network.ca_files changed, which takes a restart"},
		{"token", func(c *config.Config) { c.Server.Token = "" }, "server.listen is tcp: server.token may not be removed"},
	} {
		next := reloadBase()
		c.mutate(next)
		applied, err := h.d.reload(next)
		if applied || err == nil || err.Error() != c.wantErr {
			t.Errorf("%s: applied %v, %v; want refused with %q", c.name, applied, err, c.wantErr)
		}
		if h.d.cfg != cfg || h.d.api.cfg.Load() != cfg {
			t.Errorf("%s: the config changed after a refused reload", c.name)
		}
	}
	if s := fmt.Sprint(config.RestartOnly(cfg, cfg)); s != "[]" {
		t.Errorf("RestartOnly of a config and itself: %s", s)
	}
}

// fakeSandboxes records what the server asks of its live sandboxes.
type fakeSandboxes struct {
	runapi.Sandboxes
	mu                    sync.Mutex
	max                   int
	lifetime, maxLifetime time.Duration
}

func (f *fakeSandboxes) SetMax(n int) {
	f.mu.Lock()
	f.max = n
	f.mu.Unlock()
}

func (f *fakeSandboxes) Get(string, string) runapi.Sandbox { return nil }

func (f *fakeSandboxes) Create(_ context.Context, _ *task.Plan, _ string, lifetime, maxLifetime time.Duration) (runapi.Sandbox, error) {
	f.mu.Lock()
	f.lifetime, f.maxLifetime = lifetime, maxLifetime
	f.mu.Unlock()
	return fakeSandbox{}, nil
}

// fakeSandbox is a sandbox that only shows itself.
type fakeSandbox struct{ runapi.Sandbox }

func (fakeSandbox) Info() runapi.SandboxInfo {
	return runapi.SandboxInfo{ID: "sb-00000000000000000000000000000000"}
}
