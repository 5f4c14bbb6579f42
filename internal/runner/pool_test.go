package runner

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/backend"
	"github.com/agentrun/agentrun/runtime/spec"
)

// The pool's take, keep and shape logic, with a set-up that makes nothing
// on the host: no root.

type fakeBackend struct{ poolable, warm bool }

func (f fakeBackend) Traits() backend.Traits {
	return backend.Traits{CgroupParent: "/agentrun", Poolable: f.poolable, Warm: f.warm}
}

func (fakeBackend) Prepare(context.Context, *backend.Container) (backend.Prepared, error) {
	return nil, errors.New("the pool's set-up is faked")
}
func (fakeBackend) IDs() ([]string, error)    { return nil, nil }
func (fakeBackend) RemoveCgroupParent() error { return nil }
func (fakeBackend) Cleanup(string) error      { return nil }

type fakePrepared struct{ ready atomic.Bool }

func (f *fakePrepared) Exec(context.Context, backend.Program) (*backend.Outcome, error) {
	return nil, errors.New("not run here")
}
func (f *fakePrepared) Ready() bool    { return f.ready.Load() }
func (f *fakePrepared) Destroy() error { return nil }

// fakeSetup makes sandboxes that only count their destruction.
type fakeSetup struct {
	mu        sync.Mutex
	plans     []*task.Plan
	warm      [][]string // the launcher argv of each, nil for plain ones
	destroyed atomic.Int64
	// warmErr, if set, is the failure of every warm sandbox.
	warmErr error
	// hang, if set, makes every set-up wait for its context to end, and
	// fail then as a warm sandbox's launcher would.
	hang bool
}

func (f *fakeSetup) setup(ctx context.Context, plan *task.Plan, img *image.Image, warm []string) (*sandbox, error) {
	f.mu.Lock()
	f.plans = append(f.plans, plan)
	f.warm = append(f.warm, warm)
	err, hang := f.warmErr, f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, &warmError{fmt.Errorf("waiting for the launcher: %w", ctx.Err())}
	}
	if warm != nil && err != nil {
		return nil, &warmError{err}
	}
	prep := &fakePrepared{}
	prep.ready.Store(true)
	sb := &sandbox{id: newID(), prep: prep}
	sb.undo.Add(func() error { f.destroyed.Add(1); return nil })
	return sb, nil
}

const testImage = "busybox"

func testPool(t *testing.T, size int) (*Pool, *fakeSetup, *image.Image) {
	t.Helper()
	r := &Runner{backends: map[string]backend.Backend{
		config.RuntimeLibcontainer: fakeBackend{poolable: true, warm: true},
		config.RuntimeRunsc:        fakeBackend{},
	}}
	p := r.NewPool(map[string]int{testImage: size})
	f := &fakeSetup{}
	p.setup = f.setup // before any kick wakes the filler
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p, f, &image.Image{Ref: testImage, Digest: "sha256:0123", Rootfs: t.TempDir()}
}

func testPlan() *task.Plan {
	return &task.Plan{
		Image: testImage, Runtime: config.RuntimeLibcontainer,
		Argv: []string{"python3", "-u", "/workspace/main.py"}, CodeFile: "main.py", Code: []byte("print(1)"),
		Stdin: []byte("in"), Files: map[string][]byte{"a": []byte("b")}, Env: map[string]string{"A": "1"},
		Limits: task.Limits{Timeout: 5 * time.Second, Memory: 256 << 20, TmpSize: 64 << 20, WorkspaceSize: 64 << 20,
			NetBytes: 64 << 20, CPUs: 0.5, Pids: 64, OutputBytes: 65536, NetConns: 32},
	}
}

// allowOf parses a test plan's allowlist entries; it panics on a bad one.
func allowOf(entries ...string) *netpolicy.Allowlist {
	a, err := netpolicy.ParseAllow(entries)
	if err != nil {
		panic(err)
	}
	return a
}

// waitReady waits until the pool holds n ready sandboxes of the image.
func waitReady(t *testing.T, p *Pool, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); p.Stats().Ready[testImage] != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool holds %d ready sandboxes; want %d", p.Stats().Ready[testImage], n)
		}
	}
}

// runOnEmpty takes for a run of plan from the empty pool p, which gives
// none, ends the run and waits for the pool to hold n of its shape.
func runOnEmpty(t *testing.T, p *Pool, plan *task.Plan, img *image.Image, n int) {
	t.Helper()
	if sb := p.take(plan, img, nil); sb != nil {
		t.Fatal("an empty pool gave a sandbox")
	}
	p.ran(plan)
	waitReady(t, p, n)
}

func TestPoolFillsTheShapeOfTheLatestRun(t *testing.T) {
	p, f, img := testPool(t, 2)
	plan := testPlan()
	runOnEmpty(t, p, plan, img, 2)
	f.mu.Lock()
	made := f.plans[0]
	f.mu.Unlock()
	if made.Code != nil || made.Files != nil || made.Stdin != nil || made.CodeFile != "" {
		t.Errorf("the pool's set-up got a run's code, files or stdin: %+v", made)
	}
	// Another run of the same shape: other code, stdin, timeout and output
	// cap, none of which the set-up uses.
	next := testPlan()
	next.Code, next.Stdin = []byte("print(2)"), nil
	next.Limits.Timeout, next.Limits.OutputBytes = time.Second, 1024
	if sb := p.take(next, img, nil); sb == nil {
		t.Fatal("a run of the kept shape got no sandbox")
	}
	st := p.Stats()
	if st.Hits != 1 || st.Misses != 1 || st.Ready[testImage] != 1 {
		t.Errorf("stats %+v; want 1 hit, 1 miss, 1 ready", st)
	}
}

// A live sandbox's create moves the pool to its shape and ends no run
// (no ran): the pool fills the new shape all the same, and the next
// create of it is served, though the old shape was full when it moved.
func TestPoolFillsTheShapeOfALiveSandbox(t *testing.T) {
	p, _, img := testPool(t, 1)
	runOnEmpty(t, p, testPlan(), img, 1)
	live := testPlan()
	live.Live = true
	if sb := p.take(live, img, nil); sb != nil {
		t.Fatal("a live sandbox got a run's sandbox")
	}
	waitReady(t, p, 1)
	if sb := p.take(live, img, nil); sb == nil {
		t.Fatalf("a second live sandbox was not served: %+v", p.Stats())
	}
}

// Every limit config.LimitTable marks Shape changes the sandbox's spec, and
// its shape; no other limit changes either. A limit added to set-up
// without its Shape mark, or marked without set-up using it, fails here.
func TestShapeKeyFollowsWhatSetupUses(t *testing.T) {
	img := &image.Image{Ref: testImage, Digest: "sha256:0123", Rootfs: t.TempDir()}
	build := func(p *task.Plan) *specs.Spec {
		t.Helper()
		s, err := spec.New("/rootfs", SandboxSpec(p, "/agentrun/ar-1", "/usr/bin/tini", "/ws", p.Limits.WorkspaceSize)...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := testPlan()
	if n := reflect.TypeFor[task.Limits]().NumField(); n != len(config.LimitTable) {
		t.Fatalf("task.Limits has %d fields, config.LimitTable %d rows", n, len(config.LimitTable))
	}
	for _, lim := range config.LimitTable {
		t.Run(lim.Name, func(t *testing.T) {
			p := testPlan()
			f := limitField(&p.Limits, lim.Name)
			switch f.Kind() {
			case reflect.Float64:
				f.SetFloat(f.Float() * 2)
			default:
				f.SetInt(f.Int() * 2)
			}
			specChanged := !reflect.DeepEqual(build(base), build(p))
			keyChanged := shapeKey(base, img) != shapeKey(p, img)
			if specChanged != lim.Shape || keyChanged != lim.Shape {
				t.Errorf("doubling %s: spec changed %v, shape key changed %v; the table says Shape %v", lim.Name, specChanged, keyChanged, lim.Shape)
			}
		})
	}
	for name, change := range map[string]func(*task.Plan){
		"argv":    func(p *task.Plan) { p.Argv = []string{"node", "/workspace/main.js"} },
		"env":     func(p *task.Plan) { p.Env = map[string]string{"A": "2"} },
		"runtime": func(p *task.Plan) { p.Runtime = config.RuntimeRunsc },
		"network": func(p *task.Plan) { p.Allow = allowOf("pypi.org") },
	} {
		p := testPlan()
		change(p)
		if shapeKey(base, img) == shapeKey(p, img) {
			t.Errorf("another %s keeps the shape key", name)
		}
	}
	// The allowlist itself is bound at take: another one is the same shape.
	a, b := testPlan(), testPlan()
	a.Allow, b.Allow = allowOf("pypi.org"), allowOf("example.com:8443", "*.example.org")
	if shapeKey(a, img) != shapeKey(b, img) {
		t.Error("another allowlist changes the shape key")
	}
	other := &image.Image{Ref: testImage, Digest: "sha256:0123", Rootfs: t.TempDir()}
	if shapeKey(base, img) == shapeKey(base, other) {
		t.Error("another rootfs keeps the shape key")
	}
}

func TestPoolDropsTheOldShape(t *testing.T) {
	p, f, img := testPool(t, 2)
	plan := testPlan()
	p.take(plan, img, nil)
	p.ran(plan)
	waitReady(t, p, 2)
	bigger := testPlan()
	bigger.Limits.Memory *= 2
	if sb := p.take(bigger, img, nil); sb != nil {
		t.Fatal("a run of another shape got a sandbox of the old one")
	}
	for deadline := time.Now().Add(10 * time.Second); f.destroyed.Load() != 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the old shape's 2 sandboxes destroyed", f.destroyed.Load())
		}
	}
	p.ran(bigger)
	waitReady(t, p, 2)
	if sb := p.take(bigger, img, nil); sb == nil {
		t.Fatal("the new shape's run got no sandbox")
	}
	if sb := p.take(plan, img, nil); sb != nil {
		t.Fatal("the old shape's run got a sandbox of the new one")
	}
}

// TestPoolKeepsTheCommonShapeOfAMix: runs of one shape mixed with runs of
// several others, each rarer, keep the common shape ready; a shape that
// becomes the most common then takes over.
func TestPoolKeepsTheCommonShapeOfAMix(t *testing.T) {
	p, _, img := testPool(t, 1)
	plan := testPlan()
	for range 3 {
		p.take(plan, img, nil)
		p.ran(plan)
		waitReady(t, p, 1)
	}
	other := func(i int) *task.Plan {
		o := testPlan()
		o.Limits.Memory += int64(i+1) << 20
		return o
	}
	for i := range 6 {
		// A rarer shape: a miss that leaves the kept shape alone.
		if sb := p.take(other(i), img, nil); sb != nil {
			t.Fatalf("round %d: a run of another shape got a sandbox", i)
		}
		p.ran(plan)
		waitReady(t, p, 1)
		if sb := p.take(plan, img, nil); sb == nil {
			t.Fatalf("round %d: the common shape's run got no sandbox after a rarer shape ran", i)
		}
		p.ran(plan)
		waitReady(t, p, 1)
	}
	// other(0) becomes as common as plan among the last runs: it is kept.
	for range followWindow / 2 {
		p.take(other(0), img, nil)
		p.ran(plan)
	}
	waitReady(t, p, 1)
	if sb := p.take(other(0), img, nil); sb == nil {
		t.Fatal("the shape that became the most common got no sandbox")
	}
}

func TestPoolSkipsSandboxesNoLongerReady(t *testing.T) {
	p, f, img := testPool(t, 2)
	plan := testPlan()
	p.take(plan, img, nil)
	p.ran(plan)
	waitReady(t, p, 2)
	p.mu.Lock()
	dead := p.shapes[testImage].ready[0]
	p.mu.Unlock()
	dead.prep.(*fakePrepared).ready.Store(false) // its init was killed
	sb := p.take(plan, img, nil)
	if sb == nil || sb == dead {
		t.Fatalf("take = %v; want the ready one, not %v", sb, dead)
	}
	for deadline := time.Now().Add(10 * time.Second); f.destroyed.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the dead sandbox was not destroyed")
		}
	}
}

// TestPoolClaimFailureRunsCold: a sandbox whose claim fails at take (its
// proxy cannot be bound) is not given to the run, which then sets up its
// own: take returns nil, counts a miss and no hit, keeps the error as the
// pool's latest failure, destroys that sandbox and refills. The next
// take's claim, which succeeds, gets a sandbox.
func TestPoolClaimFailureRunsCold(t *testing.T) {
	p, f, img := testPool(t, 1)
	plan := testPlan()
	p.take(plan, img, nil) // the shape, seeded as by a first run
	p.ran(plan)
	waitReady(t, p, 1)
	before := p.Stats()
	var claimed *sandbox
	sb := p.take(plan, img, func(sb *sandbox) error { claimed = sb; return errors.New("proxy closed") })
	if sb != nil || claimed == nil {
		t.Fatalf("take = %v after a failed claim of %v; want nil (run cold)", sb, claimed)
	}
	st := p.Stats()
	if st.Hits != before.Hits || st.Misses != before.Misses+1 {
		t.Errorf("after a failed claim: hits %d -> %d, misses %d -> %d; want one miss", before.Hits, st.Hits, before.Misses, st.Misses)
	}
	if !strings.Contains(st.LastErr, "claiming a pooled sandbox: proxy closed") {
		t.Errorf("LastErr = %q; want the claim's error", st.LastErr)
	}
	for deadline := time.Now().Add(10 * time.Second); f.destroyed.Load() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox whose claim failed was not destroyed")
		}
	}
	p.ran(plan)
	waitReady(t, p, 1)
	var ok *sandbox
	if sb := p.take(plan, img, func(sb *sandbox) error { ok = sb; return nil }); sb == nil || sb != ok || sb == claimed {
		t.Fatalf("take after a refill = %v (claimed %v); want a new sandbox, claimed", sb, ok)
	}
	if st := p.Stats(); st.Hits != before.Hits+1 {
		t.Errorf("hits = %d; want %d", st.Hits, before.Hits+1)
	}
}

func TestPoolServesOnlyWhatItCanHold(t *testing.T) {
	p, f, img := testPool(t, 1)
	netPlan := testPlan()
	netPlan.Allow, netPlan.Services = allowOf("pypi.org"), []string{"github"}
	runscPlan := testPlan()
	runscPlan.Runtime = config.RuntimeRunsc
	otherImage := testPlan()
	otherImage.Image = "python"
	// A run with tools has its own broker, module and PYTHONPATH: with an
	// allowlist or without, no pooled sandbox serves it.
	toolsPlan, toolsNetPlan := testPlan(), testPlan()
	toolsPlan.Tools = []string{"ev"}
	toolsNetPlan.Allow, toolsNetPlan.Tools = allowOf("pypi.org"), []string{"ev"}
	for _, plan := range []*task.Plan{netPlan, runscPlan, otherImage, toolsPlan, toolsNetPlan} {
		if sb := p.take(plan, img, nil); sb != nil {
			t.Errorf("take(%s, %v, services %v, tools %v) gave a sandbox", plan.Image, plan.Runtime, plan.Services, plan.Tools)
		}
		p.ran(plan)
	}
	for _, plan := range []*task.Plan{netPlan, toolsPlan, toolsNetPlan} {
		if err := p.Seed(context.Background(), plan); err == nil {
			t.Errorf("Seed of a task with services %v, tools %v was accepted", plan.Services, plan.Tools)
		}
	}
	time.Sleep(10 * time.Millisecond) // a filler woken by mistake would call the set-up now
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := p.Stats(); len(f.plans) != 0 || st.Misses != 0 || st.Hits != 0 {
		t.Errorf("set-up ran %d times, stats %+v; want none", len(f.plans), st)
	}
}

// A task with an allowlist is kept ready as a sandbox with a network, for
// any allowlist; a task without one is another shape.
func TestPoolKeepsAllowlistTasks(t *testing.T) {
	p, f, img := testPool(t, 1)
	first := testPlan()
	first.Allow = allowOf("pypi.org")
	if sb := p.take(first, img, nil); sb != nil {
		t.Fatal("an empty pool gave a sandbox")
	}
	p.ran(first)
	waitReady(t, p, 1)
	f.mu.Lock()
	made := f.plans[0]
	f.mu.Unlock()
	if made.Allow.Empty() {
		t.Fatal("the pool's set-up got a plan without network for an allowlist task")
	}
	second := testPlan()
	second.Allow = allowOf("example.com")
	if sb := p.take(second, img, nil); sb == nil {
		t.Fatal("a task with another allowlist got no sandbox")
	}
	p.ran(second)
	waitReady(t, p, 1)
	if sb := p.take(testPlan(), img, nil); sb != nil {
		t.Fatal("a task without network got a sandbox made with one")
	}
}

func TestPoolCloseDestroysWhatItHolds(t *testing.T) {
	r := &Runner{backends: map[string]backend.Backend{config.RuntimeLibcontainer: fakeBackend{poolable: true}}}
	p := r.NewPool(map[string]int{testImage: 3})
	f := &fakeSetup{}
	p.setup = f.setup
	img := &image.Image{Ref: testImage, Digest: "sha256:0123", Rootfs: t.TempDir()}
	plan := testPlan()
	p.take(plan, img, nil)
	p.ran(plan)
	waitReady(t, p, 3)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if n := f.destroyed.Load(); n != 3 {
		t.Errorf("Close destroyed %d of 3 sandboxes", n)
	}
	if sb := p.take(plan, img, nil); sb != nil {
		t.Error("a closed pool gave a sandbox")
	}
}

// Fills go on beside runs on the CPUs the runs leave free, one while the
// runs take every CPU, and none while they outnumber the CPUs.
func TestFillLimit(t *testing.T) {
	for _, c := range []struct{ cpus, running, want int }{
		{2, 0, 2}, {2, 1, 1}, {2, 2, 1}, {2, 3, 0}, {2, 8, 0},
		{1, 0, 1}, {1, 1, 1}, {1, 2, 0},
		{16, 4, 12}, {16, 16, 1}, {16, 17, 0},
	} {
		p := &Pool{cpus: c.cpus, running: c.running}
		if got := p.fillLimit(); got != c.want {
			t.Errorf("%d CPUs, %d runs: fillLimit %d, want %d", c.cpus, c.running, got, c.want)
		}
	}
}

// warmPool is testPool with warm settings for the test image.
func warmPool(t *testing.T, size int, f *fakeSetup) (*Pool, *image.Image) {
	t.Helper()
	p, fake, img := testPool(t, size)
	p.mu.Lock()
	p.setup = f.setup
	p.mu.Unlock()
	_ = fake
	cfg := config.Default()
	cfg.Server.Pool = map[string]config.PoolEntry{testImage: {Count: size, Warm: &config.Warm{Language: "python", Preload: []string{"numpy", "pandas"}}}}
	p.SetWarm(cfg)
	return p, img
}

// TestWarmFor: the tasks that run warm are code in the warm language's
// argv, on a backend that can, without PYTHON* in their env; the
// launcher's argv is the language's with the launcher before the file.
func TestWarmFor(t *testing.T) {
	p, _ := warmPool(t, 1, &fakeSetup{})
	want := []string{"python3", "-u", launcher.WarmPath, backend.FDArg, "numpy,pandas", "/workspace/main.py"}
	p.mu.Lock()
	defer p.mu.Unlock()
	if got := p.warmFor(testPlan()); !reflect.DeepEqual(got, want) {
		t.Fatalf("warmFor = %q; want %q", got, want)
	}
	for name, change := range map[string]func(*task.Plan){
		"command":        func(pl *task.Plan) { pl.CodeFile = "" },
		"other argv":     func(pl *task.Plan) { pl.Argv = []string{"python3", "/workspace/main.py"} },
		"extra argument": func(pl *task.Plan) { pl.Argv = append(pl.Argv, "x") },
		"PYTHON env":     func(pl *task.Plan) { pl.Env = map[string]string{"PYTHONPATH": "/x"} },
		"runsc":          func(pl *task.Plan) { pl.Runtime = config.RuntimeRunsc },
		"other image":    func(pl *task.Plan) { pl.Image = "other" },
	} {
		pl := testPlan()
		change(pl)
		if got := p.warmFor(pl); got != nil {
			t.Errorf("%s: warmFor = %q; want nil (not warm)", name, got)
		}
	}
}

// TestWarmFailureGoesPlain: a warm sandbox that fails makes the image's
// pool make plain ones, says why, and serves the same tasks from them.
func TestWarmFailureGoesPlain(t *testing.T) {
	f := &fakeSetup{warmErr: errors.New("preload numpy: ModuleNotFoundError")}
	p, img := warmPool(t, 1, f)
	plan := testPlan()
	p.take(plan, img, nil) // keeps its shape
	p.ran(plan)
	waitReady(t, p, 1)
	if st := p.Stats().Warm[testImage]; !strings.Contains(st, "ModuleNotFoundError") {
		t.Fatalf("Stats().Warm = %q; want the failure", st)
	}
	if sb := p.take(plan, img, nil); sb == nil {
		t.Fatal("a task of the warm shape got no plain sandbox")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.warm[0] == nil || f.warm[len(f.warm)-1] != nil {
		t.Errorf("made %q; want a warm sandbox first, plain ones after", f.warm)
	}
	// New settings try warm again.
	cfg := config.Default()
	cfg.Server.Pool = map[string]config.PoolEntry{testImage: {Count: 1, Warm: &config.Warm{Language: "python", Preload: []string{"json"}}}}
	p.SetWarm(cfg)
	if st := p.Stats().Warm[testImage]; st != runapi.WarmOK {
		t.Errorf("after new settings Stats().Warm = %q; want %q", st, runapi.WarmOK)
	}
}

// TestRefillWaitsForTheProgram: a sandbox taken while another is ready is
// replaced once its run's program has ended, not at its take; the last
// one is replaced at once.
func TestRefillWaitsForTheProgram(t *testing.T) {
	p, f, img := testPool(t, 2)
	plan := testPlan()
	p.take(plan, img, nil)
	p.ran(plan)
	waitReady(t, p, 2)
	made := func() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.plans) }
	before := made()
	p.begin()
	first := p.take(plan, img, nil)
	if first == nil || first.refill == nil {
		t.Fatalf("took %+v; want a sandbox whose refill waits", first)
	}
	time.Sleep(50 * time.Millisecond)
	if n := made(); n != before {
		t.Fatalf("%d sandboxes made while the run's program ran; want none", n-before)
	}
	p.ended(first)
	p.ended(first) // only the first counts
	waitReady(t, p, 2)
	p.ran(plan)
	// The last one ready: replaced at once.
	p.begin()
	a := p.take(plan, img, nil)
	if b := p.take(plan, img, nil); b == nil || b.refill != nil {
		t.Fatalf("took the last one %+v; want its refill at once", b)
	}
	waitReady(t, p, 1)
	p.ended(a)
	waitReady(t, p, 2)
	p.ran(plan)
	if st := p.Stats(); st.Ready[testImage] != 2 {
		t.Errorf("stats %+v", st)
	}
}

// limitField is the field of l whose JSON name is name.
func limitField(l *task.Limits, name string) reflect.Value {
	v := reflect.ValueOf(l).Elem()
	for i := range v.NumField() {
		if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ","); tag == name {
			return v.Field(i)
		}
	}
	panic("task.Limits has no limit " + name)
}

// Close cancels the fills going on instead of waiting for them to end,
// and a fill it cancels is neither kept nor taken for a failure of the
// image's (a warm image does not go cold, the pool has no error).
func TestPoolCloseCancelsFills(t *testing.T) {
	r := &Runner{backends: map[string]backend.Backend{config.RuntimeLibcontainer: fakeBackend{poolable: true, warm: true}}}
	p := r.NewPool(map[string]int{testImage: 2})
	f := &fakeSetup{hang: true}
	p.setup = f.setup
	cfg := config.Default()
	cfg.Server.Pool = map[string]config.PoolEntry{testImage: {Count: 2, Warm: &config.Warm{Language: "python"}}}
	p.SetWarm(cfg)
	img := &image.Image{Ref: testImage, Digest: "sha256:0123", Rootfs: t.TempDir()}
	p.take(testPlan(), img, nil)
	p.ran(testPlan())
	for deadline := time.Now().Add(10 * time.Second); p.Stats().Filling == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pool started no fill")
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for a fill that only its cancellation ends")
	}
	st := p.Stats()
	if st.LastErr != "" || st.Warm[testImage] != runapi.WarmOK || st.Ready[testImage] != 0 {
		t.Errorf("after Close: %+v; want no error, the image still warm, nothing ready", st)
	}
}
