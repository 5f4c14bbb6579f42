package runner

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// Pool keeps sandboxes set up ahead of demand: their state dir, workspace
// and prepared container (on libcontainer, started up to the program's own
// exec, which waits for its run's hand-over: backend.Container.Ahead; a
// runsc sandbox created and not started). A run that
// finds one ready skips all of its set-up; each sandbox serves one run
// only and is destroyed after it.
//
// A sandbox is made for one task shape: the image, argv, environment and
// limits that the container is created with. For each image it is sized
// for, the pool keeps ready sandboxes of one shape: the one it was seeded
// with, until a run of another shape comes whose shape is at least as
// common as the kept one among the image's last followWindow runs. An
// agent that changes its kind of task moves the pool at its first run of
// the new kind (or within a few runs); a mix in which one shape is the
// most common keeps that one, and is not thrashed by the others.
//
// A sandbox for a task with an allowlist is made with its network: the
// namespace pair, the veth and its addresses, and a proxy listening in the
// gateway namespace that denies everything. The run that takes it binds
// its own policy to that proxy (allowlist, hosts, limits), once; the
// sandbox serves that run only. Tasks with services run cold: their proxy
// terminates TLS with a CA minted for the run, whose certificate is
// mounted into the container as it is created. So do tasks of a runtime
// whose prepared containers cannot wait (Traits.Poolable).
//
// The pool fills in the background, several sandboxes at once, as many as
// there are CPUs not taken by runs, and one at a time while runs take
// every CPU: a run never waits for a fill, and a run that finds no sandbox
// ready sets one up itself at once, as without a pool. The replacement of
// a sandbox a run takes while others of its shape are ready waits until
// that run's program has ended, so as not to compete with it.
//
// An image with warm settings (SetWarm) gets warm sandboxes for the tasks
// that can run in one (see warm.go); the others of the image are served
// as without them.
type Pool struct {
	r *Runner
	// setup makes one sandbox for plan: the runner's set-up, without
	// files; warm, if not nil, is the argv of a warm sandbox's launcher.
	// It stops once ctx is done.
	setup func(ctx context.Context, plan *task.Plan, img *image.Image, warm []string) (*sandbox, error)
	// fills is the fills' context: Close cancels it, so that it need not
	// wait for a slow set-up (a runsc create, a warm interpreter's
	// imports) to end.
	fillCtx    context.Context
	cancelFill context.CancelFunc

	mu     sync.Mutex
	sizes  map[string]int      // image ref -> sandboxes kept ready
	shapes map[string]*shape   // image ref -> the shape kept ready for it
	recent map[string][]string // image ref -> shape keys of its last runs, oldest first
	closed bool
	err    error            // the latest failure to fill, nil once one succeeds
	hits   map[string]int64 // image ref -> runs served from the pool
	misses map[string]int64 // image ref -> runs of the image that ran cold
	// running counts the runner's runs going on, filling its fills: at
	// most fillLimit of them.
	running, filling, cpus int
	retry                  time.Time // no fill before then, after a failure

	warm map[string]warmSetting // image ref -> its warm settings
	// cold is, per image ref with warm settings, why its warm sandboxes
	// failed: it is served plain ones until the settings change.
	cold map[string]string

	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	bg    sync.WaitGroup // destroys of sandboxes of a shape no longer kept
	fills sync.WaitGroup
}

// shape is one task shape and the sandboxes ready for it, oldest first.
type shape struct {
	key     string
	plan    *task.Plan // code, files and stdin dropped
	img     *image.Image
	warm    []string // a warm sandbox's launcher argv; nil for plain ones
	ready   []*sandbox
	filling int // sandboxes being made for it
	// waiting counts the sandboxes taken whose replacement waits for the
	// end of their run's program.
	waiting int
}

// followWindow is how many of an image's latest runs decide which shape
// the pool keeps for it.
const followWindow = 8

// count is how many of keys are key.
func count(keys []string, key string) int {
	n := 0
	for _, k := range keys {
		if k == key {
			n++
		}
	}
	return n
}

// fillRetry is how long the pool waits after a failure to fill.
const fillRetry = time.Second

// NewPool starts a pool that keeps sizes[ref] sandboxes of r ready for
// image ref (once it knows a shape for it: from Seed or from a run); r's
// runs take them once UsePool gives it to r. Close stops it and destroys
// what it holds.
func (r *Runner) NewPool(sizes map[string]int) *Pool {
	fillCtx, cancelFill := context.WithCancel(context.Background())
	p := &Pool{r: r, sizes: map[string]int{}, shapes: map[string]*shape{}, recent: map[string][]string{},
		setup: func(ctx context.Context, plan *task.Plan, img *image.Image, warm []string) (*sandbox, error) {
			return r.setup(ctx, poolRequest(plan, img, warm))
		},
		fillCtx: fillCtx, cancelFill: cancelFill,
		warm: map[string]warmSetting{}, cold: map[string]string{},
		hits: map[string]int64{}, misses: map[string]int64{}, cpus: runtime.NumCPU(),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	for ref, n := range sizes {
		if n > 0 {
			p.sizes[ref] = n
		}
	}
	go p.fill()
	return p
}

// UsePool makes r's runs take their sandboxes from p, one of r's own
// (NewPool), when it has one ready; call it before r's first run.
func (r *Runner) UsePool(p *Pool) {
	if p.r != r {
		panic("runner: UsePool of another runner's pool")
	}
	r.pool = p
}

// Seed makes plan's shape the one kept ready for its image, as if it had
// just run. It is an error if the pool does not keep that image or the
// plan could never be served from a pool. ctx bounds the pull of its
// image.
func (p *Pool) Seed(ctx context.Context, plan *task.Plan) error {
	p.mu.Lock()
	size := p.sizes[plan.Image]
	p.mu.Unlock()
	if size == 0 {
		return fmt.Errorf("the pool keeps no sandboxes for image %q", plan.Image)
	}
	if !p.poolable(plan) {
		return fmt.Errorf("image %q: a task with services, tools or runtime %q never runs from the pool", plan.Image, plan.Runtime)
	}
	img, err := p.r.store.Get(ctx, plan.Image, image.PullOptions{})
	if err != nil {
		return err // an *image.Error, which names the image
	}
	img.Release() // the pool's sandboxes hold it, each for its life
	p.mu.Lock()
	warm := p.warmFor(plan)
	key := warmKey(shapeKey(plan, img), warm)
	if s := p.shapes[plan.Image]; !p.closed && key != "" && (s == nil || s.key != key) {
		p.keep(plan, img, key, warm)
	}
	p.poke()
	p.mu.Unlock()
	return nil
}

// take returns a ready sandbox of plan's shape, or nil; either way plan's
// shape is the one kept ready for its image from now on. claim, if not
// nil, makes the sandbox the run's (binds its proxy to the run's policy):
// a sandbox it fails on is destroyed, counted as a miss and its error
// kept as the pool's latest failure, and take returns nil, so that the
// run sets up its own sandbox as without a pool (and meets the error
// again there if the run, not the sandbox, causes it).
func (p *Pool) take(plan *task.Plan, img *image.Image, claim func(*sandbox) error) *sandbox {
	return p.takeFor(plan, img, false, claim)
}

// takeFor is take, of a warm sandbox only for a run in a kept session
// (session): only a warm one can get the session's disk as its
// workspace (Runner.adoptSession). For such a run of an image whose
// sandboxes are not warm it is nil, and the pool is left as it was, as
// when kept sessions never ran from it.
func (p *Pool) takeFor(plan *task.Plan, img *image.Image, session bool, claim func(*sandbox) error) *sandbox {
	sb := p.pop(plan, img, session)
	if sb == nil || claim == nil {
		return sb
	}
	err := claim(sb)
	if err == nil {
		return sb
	}
	p.failed(plan, fmt.Errorf("claiming a pooled sandbox: %w", err))
	p.mu.Lock()
	p.drop(sb)
	p.mu.Unlock()
	return nil
}

// drop destroys sb, a sandbox the pool will not give out, in the
// background; at once if the pool is closed (Close waits for the
// background, and nothing may start there after it). p.mu is held.
func (p *Pool) drop(sb *sandbox) {
	if p.closed {
		_ = sb.undo.Clean()
		return
	}
	p.bg.Go(func() { _ = sb.undo.Clean() })
}

// pop is takeFor without a claim.
func (p *Pool) pop(plan *task.Plan, img *image.Image, session bool) *sandbox {
	if p == nil || !p.poolable(plan) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	warm := p.warmFor(plan)
	if session && warm == nil {
		return nil
	}
	key := warmKey(shapeKey(plan, img), warm)
	if p.sizes[plan.Image] == 0 {
		return nil
	}
	if p.closed || key == "" {
		p.misses[plan.Image]++
		return nil
	}
	recent := append(p.recent[plan.Image], key)
	if len(recent) > followWindow {
		recent = recent[len(recent)-followWindow:]
	}
	p.recent[plan.Image] = recent
	s := p.shapes[plan.Image]
	if s == nil || s.key != key {
		p.misses[plan.Image]++
		if s == nil || count(recent, key) >= count(recent, s.key) {
			p.keep(plan, img, key, warm)
		}
		return nil
	}
	for len(s.ready) > 0 {
		sb := s.ready[0]
		s.ready = s.ready[1:]
		if sb.prep.Ready() {
			p.hits[plan.Image]++
			if len(s.ready) > 0 {
				// Its replacement waits for the end of the run's
				// program (ended), the next run having one ready.
				s.waiting++
				sb.refill = s
			} else {
				p.poke() // its replacement, on a CPU the run leaves free
			}
			return sb
		}
		// Its init is gone (killed while it waited): drop it.
		p.drop(sb)
	}
	p.misses[plan.Image]++
	return nil
}

// failed tells the pool that a sandbox it gave out could not serve the
// run after all (its init died as it was taken, its claim failed), with
// err: the run went cold.
func (p *Pool) failed(plan *task.Plan, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hits[plan.Image]--
	p.misses[plan.Image]++
	p.err = err
}

// ended tells the pool that the program of the run in sb has ended: a
// replacement that waited for it may be made now. Only the first call for
// a sandbox counts.
func (p *Pool) ended(sb *sandbox) {
	if p == nil || sb == nil || sb.refill == nil {
		return
	}
	p.mu.Lock()
	sb.refill.waiting--
	sb.refill = nil
	p.poke()
	p.mu.Unlock()
}

// begin tells the pool that a run has started: one CPU fewer to fill on.
func (p *Pool) begin() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.running++
	p.mu.Unlock()
}

// ran tells the pool that a run begun has ended: a CPU to fill on again.
func (p *Pool) ran(plan *task.Plan) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.running--
	p.poke()
	p.mu.Unlock()
}

// Resize sets how many sandboxes the pool keeps ready per image from now
// on (a config reload). An image no longer listed loses its shape and its
// ready sandboxes, one with a smaller count its extra ones (destroyed in
// the background); a newly listed image is filled once Seed or a run gives
// it a shape. Runs going on are not touched.
func (p *Pool) Resize(sizes map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.sizes = map[string]int{}
	for ref, n := range sizes {
		if n > 0 {
			p.sizes[ref] = n
		}
	}
	var drop []*sandbox
	for ref, s := range p.shapes {
		n := p.sizes[ref]
		if len(s.ready) > n {
			drop = append(drop, s.ready[n:]...)
			s.ready = s.ready[:n:n]
		}
		if n == 0 {
			delete(p.shapes, ref)
		}
	}
	if len(drop) > 0 {
		p.bg.Go(func() { _ = destroyAll(drop) })
	}
	p.poke()
}

// keep makes key, plan's shape, the one kept ready for its image, in place
// of another; the pool fills it after the run (ran), a live sandbox's at
// once. p.mu is held, and p is not closed.
func (p *Pool) keep(plan *task.Plan, img *image.Image, key string, warm []string) {
	s := p.shapes[plan.Image]
	p.shapes[plan.Image] = &shape{key: key, plan: bare(plan), img: img, warm: warm}
	if s != nil && len(s.ready) > 0 {
		// The old shape's, in the background; Close waits for it (no Go
		// once closed).
		stale := s.ready
		s.ready = nil
		p.bg.Go(func() { _ = destroyAll(stale) })
	}
	if plan.Live {
		// A live sandbox ends no run (no ran to wake the filler), and an
		// old shape already full has no fill whose end would: its first
		// sandbox now, on a CPU the creates leave free.
		p.poke()
	}
}

// poke wakes the filler; p.mu is held.
func (p *Pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill starts a fill for each sandbox short, as long as a CPU is free.
func (p *Pool) fill() {
	defer close(p.done)
	defer p.fills.Wait()
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		for {
			s := p.next()
			if s == nil {
				break
			}
			p.fills.Go(func() { p.make(s) })
		}
	}
}

// next is a shape short of sandboxes, counted as being filled, or nil when
// none is or no CPU is free for another fill (fillLimit).
func (p *Pool) next() *shape {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.filling >= p.fillLimit() || time.Now().Before(p.retry) {
		return nil
	}
	for ref, s := range p.shapes {
		if len(s.ready)+s.filling+s.waiting < p.sizes[ref] {
			s.filling++
			p.filling++
			return s
		}
	}
	return nil
}

// make sets up one sandbox of shape s and keeps it ready, unless s is no
// longer kept or already full (a resize, a new shape, Close).
func (p *Pool) make(s *shape) {
	sb, err := p.setup(p.fillCtx, s.plan, s.img, s.warm)
	p.mu.Lock()
	s.filling--
	p.filling--
	closing := p.fillCtx.Err() != nil
	if !closing {
		p.err = err
	}
	var we *warmError
	switch {
	case closing:
		// Closed while it was made: neither kept nor a failure of the
		// image's.
	case errors.As(err, &we) && s.warm != nil:
		// The image's warm sandboxes fail: plain ones from now on, at
		// once (no retry delay: nothing is wrong with those).
		p.goCold(s, we)
	case err == nil && !p.closed && p.shapes[s.plan.Image] == s && len(s.ready) < p.sizes[s.plan.Image]:
		sb.pooled = true
		s.ready = append(s.ready, sb)
		sb = nil
	case err != nil:
		p.retry = time.Now().Add(fillRetry)
		time.AfterFunc(fillRetry, func() {
			p.mu.Lock()
			p.poke()
			p.mu.Unlock()
		})
	}
	p.poke()
	p.mu.Unlock()
	if sb != nil {
		_ = sb.undo.Clean()
	}
}

// fillLimit is how many fills may go on beside the runs going on: one per
// CPU they leave free, and one while they take no more than every CPU, so
// that back-to-back runs as many as the CPUs still find sandboxes. When the
// runs outnumber the CPUs, none: every CPU has a run waiting for it, and a
// fill would only race those runs for a sandbox that saves nothing. On 2
// CPUs at concurrency 4, serve did 7–14% more runs/s without them, in three
// sittings of the bench. p.mu is held.
func (p *Pool) fillLimit() int {
	if free := p.cpus - p.running; free > 0 {
		return free
	}
	if p.running == p.cpus {
		return 1
	}
	return 0
}

// Stats reports what the pool holds now.
func (p *Pool) Stats() runapi.PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := runapi.PoolStats{Ready: map[string]int{}, ImageHits: map[string]int64{}, ImageMisses: map[string]int64{},
		Running: p.running, Filling: p.filling}
	for ref, n := range p.hits {
		st.ImageHits[ref] = n
		st.Hits += n
	}
	for ref, n := range p.misses {
		st.ImageMisses[ref] = n
		st.Misses += n
	}
	for ref := range p.sizes {
		st.ImageHits[ref] += 0
		st.ImageMisses[ref] += 0
	}
	for ref, s := range p.shapes {
		st.Ready[ref] = len(s.ready)
	}
	if len(p.warm) > 0 {
		st.Warm = map[string]string{}
		for ref := range p.warm {
			st.Warm[ref] = cmp.Or(p.cold[ref], runapi.WarmOK)
		}
	}
	if p.err != nil {
		st.LastErr = p.err.Error()
	}
	return st
}

// Close stops filling (cancelling the fills going on) and destroys every
// ready sandbox. Runs go on without the pool.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancelFill()
	var all []*sandbox
	for _, s := range p.shapes {
		all = append(all, s.ready...)
		s.ready = nil
	}
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	p.bg.Wait()
	return destroyAll(all)
}

func destroyAll(sbs []*sandbox) error {
	var errs []error
	for _, sb := range sbs {
		if err := sb.undo.Clean(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("destroying pooled sandboxes: %v", errs)
	}
	return nil
}

// poolable reports whether plan can run in a pooled sandbox: one made
// without services (whose CA is the run's own) or tools (whose module and
// PYTHONPATH are in the spec, and whose broker is the run's), for a backend whose
// prepared containers can wait.
func (p *Pool) poolable(plan *task.Plan) bool {
	be := p.r.backends[plan.Runtime]
	return be != nil && be.Traits().Poolable && len(plan.Services) == 0 && len(plan.Tools) == 0
}

// shapeKey identifies what a sandbox for plan is created with: its image
// and runtime, and what of the plan its spec and workspace are made of
// (SandboxSpec): argv, environment and the limits config.LimitTable marks
// Shape, and whether it has a network (an allowlist) or none. What a run
// supplies later (code, files, stdin, timeout, output cap, collect, and
// the allowlist itself, bound to the proxy at take) is not part of it; a
// live sandbox's (task.Plan.Live) is apart from a run's of the same argv.
// The rootfs is named by its inode too:
// an image removed and pulled again at the same path is another rootfs,
// and the sandboxes made on the old one (whose files are gone) are not
// used. It is "" when the rootfs cannot be looked at.
func shapeKey(plan *task.Plan, img *image.Image) string {
	var st unix.Stat_t
	if err := unix.Stat(img.Rootfs, &st); err != nil {
		return ""
	}
	limits := map[string]float64{}
	for _, lim := range config.LimitTable {
		if lim.Shape {
			limits[lim.Name] = lim.Number(plan.Limits)
		}
	}
	b, _ := json.Marshal(struct {
		Image, Digest, Rootfs, Runtime string
		RootDev, RootIno               uint64
		Argv                           []string
		Env                            map[string]string
		Limits                         map[string]float64
		Network, Live                  bool
	}{plan.Image, img.Digest, img.Rootfs, plan.Runtime, st.Dev, st.Ino, plan.Argv, plan.Env, limits, !plan.Allow.Empty(), plan.Live})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// bare is a copy of plan without what a run brings: the pool keeps it.
func bare(plan *task.Plan) *task.Plan {
	c := *plan
	c.Code, c.Files, c.Stdin, c.Collect, c.CodeFile = nil, nil, nil, nil, ""
	c.Session, c.TaskHash = "", ""
	c.KeepWorkspace, c.KeepState, c.ResetState = false, false, false
	return &c
}
