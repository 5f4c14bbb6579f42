// Package server is the HTTP API of `agentrun serve`.
//
//	POST /v1/runs            a task (task.json) in, its result out
//	POST /v1/runs?stream=1   the same as NDJSON events: output as it comes, then the result
//	POST /v1/runs/RUN/approvals/ID  decide a request held for approval
//	/v1/sessions…            kept sessions (sessions.go)
//	/v1/sandboxes…           live sandboxes (sandboxes.go)
//	GET  /ui/approvals       the approvals page (server.approvals.page)
//	GET  /healthz            runs going on and waiting, and the warm pool
//	GET  /metrics            the same and more, in the Prometheus text format
//	GET  /v1/openapi.json    the API's OpenAPI 3.1 document (openapi.json)
//
// Runs are admitted under a global concurrency cap with a bounded queue,
// and per-session quotas (runs per minute, concurrent runs); a run whose
// client goes away is cancelled, which kills its sandbox.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/metrics"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// Server answers the API. Create it with New.
type Server struct {
	cfg       atomic.Pointer[config.Config] // replaced by Reload
	run       runapi.Func
	pool      func() runapi.PoolStats // nil without a pool
	slots     atomic.Pointer[chan struct{}]
	teardowns atomic.Pointer[chan struct{}] // answered runs tearing down apart from the slots
	decoding  chan struct{}                 // one large task decoded at a time
	bodies    bodyBudget                    // task bodies held outside run slots
	queued    atomic.Int64
	running   atomic.Int64
	quotas    *quotas
	metrics   *metrics.Metrics
	extra     map[string]http.Handler // more routes, behind the same auth
	ownAuth   map[string]http.Handler // routes by path prefix, each checking its own credentials
	ownNames  []ownNames              // routes by Host, each checking its own credentials
	holds     approvals.Pending       // held requests and tool calls, and the last decisions
	hook      *approvals.Webhook      // started at first use
	hookOnce  sync.Once
	ui        uiSessions
	guesses   guesses // of server.token, on the API and the page

	// Logf, when set, gets what goes wrong after a client was answered.
	Logf func(format string, args ...any)
	// Sandboxes, set before serving, are the live sandboxes that
	// /v1/sandboxes serves; nil answers 404 there.
	Sandboxes runapi.Sandboxes
	// Sessions, set before serving, is the store of kept sessions that
	// /v1/sessions serves; nil answers 404 there.
	Sessions *session.Store
	// PoolErrors, set before serving, names the pool images that could not
	// be made ready at start and why; /healthz reports them.
	PoolErrors map[string]string
	// Egress, set before serving, says whether a connection accepted from
	// client at the server's own address server is one that a run's proxy
	// of this process dialled for its sandbox and holds open (serve's
	// address listed in network.host_ports): all such connections are one
	// source of the throttle of wrong tokens (see guesses). nil: none is.
	Egress func(client, server netip.AddrPort) bool
	// PeerUID, set before serving, says which user of this host owns the
	// socket at the other end of a TCP connection accepted from client, an
	// address of the host's own, at the server's own address server: each
	// such user is a source of its own of the throttle of wrong tokens
	// (see guesses), never the operator's. nil: their address is.
	PeerUID func(client, server netip.AddrPort) (uint32, bool)
}

// New returns a server running tasks with run under cfg's limits and
// policy. pool, if not nil, reports the warm pool for /healthz.
func New(cfg *config.Config, run runapi.Func, pool func() runapi.PoolStats) *Server {
	s := &Server{run: run, pool: pool,
		decoding: make(chan struct{}, 1),
		quotas:   newQuotas(cfg.Server.Quota.RunsPerMinute, cfg.Server.Quota.Concurrent, time.Now)}
	s.cfg.Store(cfg)
	s.setCapacity(cfg.Server.MaxConcurrent)
	g := metrics.Gauges{Running: s.running.Load, Queued: s.queued.Load, Held: s.holds.Count,
		Reading: s.bodies.reading.Load, BodyBytes: s.bodies.used.Load,
		Sandboxes: func() int64 {
			if s.Sandboxes == nil {
				return 0
			}
			return int64(s.Sandboxes.Live())
		}}
	if pool != nil {
		g.Pool = func() metrics.PoolStats {
			st := pool()
			ms := metrics.PoolStats{Ready: map[string]int64{}, Hits: st.ImageHits, Misses: st.ImageMisses}
			for ref, n := range st.Ready {
				ms.Ready[ref] = int64(n)
			}
			if st.Warm != nil {
				ms.Warm = map[string]string{}
				for ref, why := range st.Warm {
					if why == runapi.WarmOK {
						why = ""
					}
					ms.Warm[ref] = why
				}
			}
			return ms
		}
	}
	s.metrics = metrics.New(g)
	s.holds.Counted, s.holds.TimedOut = s.metrics.ApprovalDecided, s.metrics.ApprovalTimedOut
	return s
}

// Reload makes cfg the config of the runs admitted from now on: its task
// defaults, policy, languages, tools and tool_limits (which each run's
// plan carries to the runner), server.max_concurrent, server.queue,
// server.quota, server.token, server.hosts, server.approvals and
// sandboxes (for the live sandboxes created from now on). Runs
// going on keep theirs; they do not count against a new max_concurrent.
// cfg must be valid.
func (s *Server) Reload(cfg *config.Config) {
	old := s.cfg.Load()
	if cfg.Server.MaxConcurrent != old.Server.MaxConcurrent {
		s.setCapacity(cfg.Server.MaxConcurrent)
	}
	s.quotas.set(cfg.Server.Quota.RunsPerMinute, cfg.Server.Quota.Concurrent)
	if s.Sandboxes != nil {
		s.Sandboxes.SetMax(cfg.Sandboxes.Max)
	}
	s.cfg.Store(cfg)
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/runs", only(s.postRun, http.MethodPost))
	mux.HandleFunc("/v1/runs/{run}/approvals/{id}", only(s.postApproval, http.MethodPost))
	mux.HandleFunc("/healthz", only(s.healthz, http.MethodGet, http.MethodHead))
	mux.HandleFunc("/metrics", only(s.serveMetrics, http.MethodGet, http.MethodHead))
	mux.HandleFunc("/v1/openapi.json", only(serveOpenAPI, http.MethodGet))
	s.routeSessions(mux)
	s.routeSandboxes(mux)
	s.routeUI(mux)
	for pattern, h := range s.extra {
		mux.Handle(pattern, h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "", fmt.Sprintf("no such endpoint %s: the API is POST /v1/runs, /v1/sessions, /v1/sandboxes, GET /healthz and GET /metrics", r.URL.Path))
	})
	return s.auth(mux)
}

// only answers a request of another method with a JSON 405.
func only(h http.HandlerFunc, methods ...string) http.HandlerFunc {
	allow := strings.Join(methods, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(methods, r.Method) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, "", fmt.Sprintf("%s %s: method not allowed; use %s", r.Method, r.URL.Path, allow))
			return
		}
		h(w, r)
	}
}

// Header and idle timeouts of the HTTP server: a client that sends its
// request line and headers slowly, or holds a connection it does not use,
// is cut off. Variables for the tests.
var (
	headerTimeout = 10 * time.Second
	idleTimeout   = 2 * time.Minute
)

// HTTPServer is an http.Server for the API with its read deadlines set
// (headers within 10 s, a task body within 30 s of them), and which lets
// a request waiting for a run slot see its client leave.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{Handler: s.Handler(), ReadHeaderTimeout: headerTimeout, IdleTimeout: idleTimeout,
		MaxHeaderBytes: 64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		}}
}

// Handle adds a route to the API (before Handler is called), behind the
// same token: another protocol spoken on the same socket, as /mcp.
func (s *Server) Handle(pattern string, h http.Handler) {
	if s.extra == nil {
		s.extra = map[string]http.Handler{}
	}
	s.extra[pattern] = h
}

// E2BPrefix is the path of the E2B door (spec §18).
const E2BPrefix = "/e2b"

// HandleOwnAuth routes every request under prefix (prefix itself, or
// prefix/…) to h, with prefix cut from its path, before Handler is
// called: a door that checks its own credentials (E2B's keys and tokens)
// instead of the API's token. The Host and cross-site checks still hold.
func (s *Server) HandleOwnAuth(prefix string, h http.Handler) {
	if s.ownAuth == nil {
		s.ownAuth = map[string]http.Handler{}
	}
	s.ownAuth[prefix] = http.StripPrefix(prefix, h)
}

// ownNames is a door that answers the names PORT-ID.DOMAIN of the
// domain its func reads from the current config ("": none).
type ownNames struct {
	domain func(*config.Config) string
	h      http.Handler
}

// HandleNames routes every request whose Host is PORT-ID.DOMAIN, DOMAIN
// what domain reads from the current config, to h, its Host and path as
// they came, before Handler is called: a door's ports by name (E2B's
// e2b.domain), behind its own credentials. An Origin may be that name
// alone, as on the preview domain.
func (s *Server) HandleNames(domain func(*config.Config) string, h http.Handler) {
	s.ownNames = append(s.ownNames, ownNames{domain: domain, h: h})
}

// namesRoute is the door whose domain r's Host is a PORT-ID name of,
// nil if none.
func (s *Server) namesRoute(r *http.Request) http.Handler {
	cfg := s.cfg.Load()
	for _, n := range s.ownNames {
		if _, _, ok := previewHost(r.Host, n.domain(cfg)); ok {
			return n.h
		}
	}
	return nil
}

// ownAuthRoute is the door whose prefix r's path is under, nil if none.
func (s *Server) ownAuthRoute(r *http.Request) http.Handler {
	for prefix, h := range s.ownAuth {
		if rest, ok := strings.CutPrefix(r.URL.Path, prefix); ok && (rest == "" || rest[0] == '/') {
			return h
		}
	}
	return nil
}

// auth refuses a request whose Host or Origin is not a name of this
// server (refuseForeignHost), a browser's cross-site request to change
// anything (a method other than GET, HEAD and OPTIONS, on every path),
// and requires the bearer token when one is configured, under the
// throttle of wrong tokens (guesses). With no token, serve behind a
// reverse proxy would otherwise take a form that another site posts from
// the operator's browser as the operator's own: a run, a session's file.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.refuseForeignHost(w, r) || refuseCrossSite(w, r) {
			return
		}
		if h := s.namesRoute(r); h != nil { // its own credentials
			h.ServeHTTP(w, r)
			return
		}
		if t, ok := portRoute(r, &s.cfg.Load().Server); ok { // its own credentials
			s.servePort(w, r, t)
			return
		}
		if h := s.ownAuthRoute(r); h != nil {
			h.ServeHTTP(w, r)
			return
		}
		token := s.cfg.Load().Server.Token
		if token == "" || isUIPath(r.URL.Path) { // the page checks the token itself
			next.ServeHTTP(w, r)
			return
		}
		ok, wait := s.bearer(r, token)
		if wait > 0 {
			s.tooManyGuesses(w, wait)
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentrun"`)
			writeError(w, http.StatusUnauthorized, "", "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer says whether r's Authorization header is the bearer token,
// under the throttle of wrong tokens (checkToken).
func (s *Server) bearer(r *http.Request, token string) (ok bool, wait time.Duration) {
	return s.checkToken(r, bearerCredentials(r.Header.Get("Authorization")), "Bearer "+token)
}

// bearerCredentials is an Authorization header h with its scheme spelled
// "Bearer" when it is that scheme in any case, and the spaces after it
// one: RFC 9110 (§11.1, §11.4) makes the scheme case-insensitive and
// allows more than one space, so "bearer TOKEN" is the same credential.
// Another scheme is left as it is, a wrong token (a guess), and "" stays
// "" (no guess).
func bearerCredentials(h string) string {
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return h
	}
	return "Bearer " + strings.TrimLeft(cred, " ")
}

// checkToken says whether got, what r carries for the token (a bearer
// header, the login form's field), is want, under the throttle of wrong
// tokens (see guesses): wait > 0 when r's source has no guess left and
// got was not compared. An empty got is no guess.
// Guess is the throttle of wrong tokens (guesses.go) for another door's
// credentials: check says whether r's credential is right; a wrong one
// spends a guess of r's source, and once its source has none left the
// credential is not checked and wait says when to try again.
func (s *Server) Guess(r *http.Request, check func() bool) (ok bool, wait time.Duration) {
	return s.guesses.try(r, peers{egress: s.Egress, uid: s.PeerUID}, check)
}

func (s *Server) checkToken(r *http.Request, got, want string) (ok bool, wait time.Duration) {
	if got == "" {
		return false, 0
	}
	return s.guesses.try(r, peers{egress: s.Egress, uid: s.PeerUID}, func() bool { return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 })
}

// crossSite refuses a browser's cross-site request (told by its
// Sec-Fetch-Site or Origin header) of a method other than GET, HEAD and
// OPTIONS, whatever credentials it carries: another site open in the
// operator's browser cannot run, log in or decide, even where no token
// is set. Clients other than browsers send neither header and pass.
var crossSite = http.NewCrossOriginProtection()

// refuseCrossSite answers 403 to a cross-site request; true when it did.
func refuseCrossSite(w http.ResponseWriter, r *http.Request) bool {
	if err := crossSite.Check(r); err != nil {
		writeError(w, http.StatusForbidden, "", "cross-site request refused")
		return true
	}
	return false
}

func (s *Server) postRun(w http.ResponseWriter, r *http.Request) {
	stream, ok := queryBool(r, "stream", false)
	if !ok {
		writeError(w, http.StatusBadRequest, "", fmt.Sprintf("stream=%q: want 1 or 0", r.URL.Query().Get("stream")))
		return
	}
	cfg := s.cfg.Load() // the whole request is under one config
	if r.ContentLength > task.MaxTaskBytes {
		s.metrics.Refused(cfg.Runtime, "")
		writeRefusal(w, tooLarge(r.ContentLength))
		return
	}
	// The body comes first, under its own bounds (bodies.go): a client
	// that does not send it never holds a run slot or a queue place.
	body, err := s.readBody(w, r)
	if err != nil {
		if errBodyMemory(err) {
			s.metrics.Refused(cfg.Runtime, metrics.QuotaBodies)
		}
		writeRefusal(w, err)
		return
	}
	t, err := s.admit(r.Context(), cfg, body)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	defer t.done()
	plan, release, adm := t.plan, t.release, t.slot

	// The answer goes out as soon as the result is final. The session's
	// quota is given back before it, so that the client's next run is not
	// refused for this one, and the run slot is handed over for a
	// tear-down slot (admission.tearDown).
	s.running.Add(1)
	defer s.running.Add(-1)
	var sent *result.Result
	var hooks runapi.Hooks
	// The connection is closed after the answer: the handler goes on with
	// the tear-down, and a client that sent its next request on this
	// connection would wait for it.
	w.Header().Set("Connection", "close")
	admitted, pooled := time.Now(), false
	hooks.Setup = func(p bool, d time.Duration) {
		pooled = p
		s.metrics.Setup(p, d)
	}
	answer := func(res *result.Result) { writeResult(w, res) }
	hooks.Approve = s.approver(cfg, plan.Session, nil)
	hooks.ToolCalled = s.metrics.ToolCalled
	if stream {
		ev := newEvents(w)
		defer ev.close()
		out := newOutputs(ev)
		hooks.Output = out.send
		hooks.Approve = s.approver(cfg, plan.Session, ev.send)
		hooks.Display = func(b map[string]string) { ev.send(Event{Event: "display", Display: b}) }
		answer = func(res *result.Result) {
			out.flush()
			ev.send(Event{Event: "result", Result: res})
			ev.close()
		}
	}
	hooks.Result = func(res *result.Result) {
		sent = res
		release()
		adm.tearDown()
		s.metrics.Ran(plan.Runtime, pooled, time.Since(admitted), res)
		answer(res)
	}
	final := s.run(r.Context(), plan, hooks)
	if sent == nil {
		release()
		s.metrics.Ran(plan.Runtime, pooled, time.Since(admitted), final)
		answer(final)
	} else if final.Error != sent.Error && s.Logf != nil {
		s.Logf("run %s: after the answer: %s", final.ID, final.Error)
	}
}

// bigTask is the size from which tasks are decoded one at a time.
const bigTask = 1 << 20

// load decodes a task. Decoding briefly takes several times a task's size
// (about 7 times: the JSON walk's buffer, the decoded strings, the plan's
// copies), so tasks larger than bigTask are decoded one at a time: the
// memory this takes is bounded by one such task, not by max_concurrent of
// them.
func (s *Server) load(ctx context.Context, body *taskBody, cfg *config.Config) (*task.Plan, error) {
	if body.size > bigTask {
		select {
		case s.decoding <- struct{}{}:
		case <-ctx.Done():
			return nil, fmt.Errorf("gave up waiting to decode the task: %w", ctx.Err())
		}
		defer func() { <-s.decoding }()
		// What the last one left is collected first, not on top of this
		// one's peak.
		runtime.GC()
	}
	// A body of chunks is joined here, one large one at a time too.
	return task.Load(body.bytes(), cfg)
}

// fieldError is an error about one field of the task: an image that
// could not be had (image.Error) is the "image" field's.
type fieldError interface{ Field() string }

// writeResult answers with the result, or with its error's status when
// agentrun could not run it: a session busy or unknown (409, 404) or an
// image that could not be had, the client's to fix; 500 the host's.
func writeResult(w http.ResponseWriter, res *result.Result) {
	status := http.StatusOK
	if res.Error != "" {
		status = statusOf(res.Err)
	}
	var fe fieldError
	if errors.As(res.Err, &fe) {
		writeError(w, status, fe.Field(), res.Error+" (run "+res.ID+")")
		return
	}
	writeJSON(w, status, res)
}

// errQueueFull is admit's refusal when the queue is full.
var errQueueFull = errkind.New(errkind.Unavailable, "server busy")

// quotaRefusal is the 429 of a run over its session's quota, counted.
func (s *Server) quotaRefusal(plan *task.Plan, err error, retry time.Duration) *runapi.Refusal {
	quota := ""
	if qe := (*quotaError)(nil); errors.As(err, &qe) {
		quota = qe.quota
	}
	s.metrics.Refused(plan.Runtime, quota)
	ref := refusal(err, errkind.Quota, "")
	ref.RetryAfter = retry
	return ref
}

// admitRefusal is the 503 of a run that got no run slot, counted.
func (s *Server) admitRefusal(runtime string, err error) *runapi.Refusal {
	quota := ""
	if errors.Is(err, errQueueFull) {
		quota = metrics.QuotaQueue
	}
	s.metrics.Refused(runtime, quota)
	ref := refusal(err, errkind.Unavailable, "")
	ref.RetryAfter = time.Second
	return ref
}

// RunTask runs task.json under the server's policy, quotas and admission,
// as POST /v1/runs does, for the server's other doors (MCP). It returns the
// result (Error set when agentrun could not run it), or a *runapi.Refusal.
func (s *Server) RunTask(ctx context.Context, data []byte) (*result.Result, error) {
	cfg := s.cfg.Load()
	t, err := s.admit(ctx, cfg, bodyOf(data))
	if err != nil {
		return nil, err
	}
	defer t.done()
	plan, adm := t.plan, t.slot
	s.running.Add(1)
	defer s.running.Add(-1)
	admitted, pooled := time.Now(), false
	approve := runapi.ApproverFrom(ctx)
	if approve == nil {
		approve = s.approver(cfg, plan.Session, nil)
	}
	res := s.run(ctx, plan, runapi.Hooks{Setup: func(p bool, d time.Duration) {
		pooled = p
		s.metrics.Setup(p, d)
	}, Approve: approve, ToolCalled: s.metrics.ToolCalled, Result: func(*result.Result) { adm.tearDown() }})
	s.metrics.Ran(plan.Runtime, pooled, time.Since(admitted), res)
	return res, nil
}

func writeRefusal(w http.ResponseWriter, err error) {
	ref, ok := err.(*runapi.Refusal)
	if !ok {
		ref = refusal(err, errkind.Unknown, "")
	}
	if ref.RetryAfter > 0 {
		w.Header().Set("Retry-After", retryAfter(ref.RetryAfter))
	}
	writeError(w, httpStatus(ref.Why), ref.Field, ref.Msg)
}

// setCapacity makes n run slots and n tear-down slots for the runs
// admitted from now on, and the body budget for n slots.
func (s *Server) setCapacity(n int) {
	s.bodies.max.Store(bodyMemory(n))
	slots, teardowns := make(chan struct{}, n), make(chan struct{}, n)
	s.slots.Store(&slots)
	s.teardowns.Store(&teardowns)
}

// admission is an admitted request's hold on the server's capacity: a run
// slot while its run goes on and, once the run is answered, a tear-down
// slot in its place, so that the next request need not wait for the
// sandbox's tear-down. There are as many tear-down slots as run slots:
// with all of them taken, an answered run keeps its run slot to the end of
// its tear-down, as if there were none. So the server's runs hold at most
// 2 × max_concurrent sandboxes at once (the pool's apart), and a burst of
// short runs cannot pile up tear-downs: it is slowed to their pace
// instead. Its methods are called from the request's goroutine only.
type admission struct {
	slots, teardowns chan struct{} // those it was admitted under (Reload may replace the server's)
	slot, teardown   bool          // which it holds
}

// tearDown hands the run slot over for a tear-down slot, if one is free;
// otherwise the run keeps its run slot.
func (a *admission) tearDown() {
	if !a.slot || a.teardown {
		return
	}
	select {
	case a.teardowns <- struct{}{}:
		a.teardown = true
		a.slot = false
		<-a.slots
	default:
	}
}

// done frees what a holds: the request has ended, and its sandbox is gone.
func (a *admission) done() {
	if a.slot {
		<-a.slots
		a.slot = false
	}
	if a.teardown {
		<-a.teardowns
		a.teardown = false
	}
}

// ticket is an admitted task: its plan, its session's quota entry and
// its hold on a run slot.
type ticket struct {
	plan    *task.Plan
	release func() // gives the quota entry back; again is nothing
	slot    *admission
}

// done gives back what t holds: the quota entry, then the slot.
func (t *ticket) done() {
	if t.release != nil {
		t.release()
	}
	if t.slot != nil {
		t.slot.done()
	}
}

// admit admits the task body, read whole, for both doors (POST /v1/runs,
// RunTask), or refuses it with a *runapi.Refusal: too large (413), a task that
// does not load (400, 403), its kept session unknown or busy (404, 409),
// over its session's quota (429), no run slot (503: the queue full, the
// client gone). The metrics count each refusal but a session's. The run
// slot comes last, so that no refusal waits in the queue first. The body
// holds its bytes of the budget until the request holds a run slot or is
// refused; the ticket's done gives back what the ticket holds.
func (s *Server) admit(ctx context.Context, cfg *config.Config, body *taskBody) (_ *ticket, err error) {
	defer body.free()
	if body.size > task.MaxTaskBytes {
		s.metrics.Refused(cfg.Runtime, "")
		return nil, tooLarge(int64(body.size))
	}
	t := &ticket{}
	defer func() {
		if err != nil {
			t.done()
		}
	}()
	if t.plan, err = s.load(ctx, body, cfg); err != nil {
		s.metrics.Refused(cfg.Runtime, "")
		return nil, runapi.TaskRefusal(err)
	}
	// The cheap refusals first: a kept session that does not exist (or
	// is busy) takes no quota entry.
	if err := s.checkSession(t.plan); err != nil {
		return nil, refusal(err, errkind.Unknown, "session")
	}
	hold, retry, err := s.quotas.take(t.plan.Session)
	if err != nil {
		return nil, s.quotaRefusal(t.plan, err, retry)
	}
	t.release = hold.release
	if t.slot, err = s.slotFor(ctx, cfg, t.plan.Runtime); err != nil {
		// It never ran: not counted against runs_per_minute either.
		hold.undo()
		return nil, err
	}
	return t, nil
}

// slotFor takes a run slot (takeSlot) for a run of runtime, or is the
// refusal (admitRefusal) of one that got none.
func (s *Server) slotFor(ctx context.Context, cfg *config.Config, runtime string) (*admission, error) {
	adm, err := s.takeSlot(ctx, cfg)
	if err != nil {
		return nil, s.admitRefusal(runtime, err)
	}
	return adm, nil
}

// takeSlot takes a run slot, waiting in the queue when all are taken. It
// fails at once when the queue is full, or when ctx ends while waiting.
// The slot is freed by the admission's done.
func (s *Server) takeSlot(ctx context.Context, cfg *config.Config) (*admission, error) {
	slots := *s.slots.Load()
	adm := &admission{slots: slots, teardowns: *s.teardowns.Load(), slot: true}
	select {
	case slots <- struct{}{}:
		return adm, nil
	default:
	}
	if s.queued.Add(1) > int64(cfg.Server.Queue) {
		s.queued.Add(-1)
		return nil, fmt.Errorf("%w: %d runs going on and %d waiting, the most it takes", errQueueFull, cfg.Server.MaxConcurrent, cfg.Server.Queue)
	}
	defer s.queued.Add(-1)
	// The HTTP server sees the client leave once the body is read, and
	// ends ctx; the connection is watched here as well.
	conn, _ := ctx.Value(connKey{}).(net.Conn)
	tick := time.NewTicker(peerPoll)
	defer tick.Stop()
	for {
		select {
		case slots <- struct{}{}:
			return adm, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("gave up waiting for a run slot: %w", ctx.Err())
		case <-tick.C:
			if conn != nil && peerGone(conn) {
				return nil, errors.New("gave up waiting for a run slot: the client left")
			}
		}
	}
}

// peerPoll is how often a waiting request's connection is checked.
const peerPoll = 100 * time.Millisecond

// connKey holds a request's connection in its context (see HTTPServer).
type connKey struct{}

// peerGone says whether the other end of c has hung up, without reading
// from it: what it sent (the task) stays to be read.
func peerGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			gone = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
		}
	})
	return gone
}

// Health is the body of GET /healthz. Status is "ok", or "degraded" when
// some pool image could not be made ready (Pool.Errors says which).
type Health struct {
	Status  string      `json:"status"`
	Running int64       `json:"running"`
	Queued  int64       `json:"queued"`
	Pool    *PoolHealth `json:"pool,omitempty"`
}

// PoolHealth is the warm pool's part of Health.
type PoolHealth struct {
	Ready     map[string]int `json:"ready"`
	Hits      int64          `json:"hits"`
	Misses    int64          `json:"misses"`
	LastError string         `json:"last_error,omitempty"`
	// Errors: image -> why the server started without sandboxes for it.
	Errors map[string]string `json:"errors,omitempty"`
	// Warm: image with warm settings -> "warm", or why its warm
	// sandboxes failed and it gets plain ones instead.
	Warm map[string]string `json:"warm,omitempty"`
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	h := Health{Status: "ok", Running: s.running.Load(), Queued: s.queued.Load()}
	if s.pool != nil {
		st := s.pool()
		h.Pool = &PoolHealth{Ready: st.Ready, Hits: st.Hits, Misses: st.Misses, LastError: st.LastErr, Warm: st.Warm}
		for _, why := range st.Warm {
			if why != runapi.WarmOK {
				h.Status = "degraded"
			}
		}
	}
	if len(s.PoolErrors) > 0 {
		if h.Pool == nil {
			h.Pool = &PoolHealth{Ready: map[string]int{}}
		}
		h.Status, h.Pool.Errors = "degraded", s.PoolErrors
	}
	writeJSON(w, http.StatusOK, h)
}

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	s.metrics.WritePrometheus(w)
}

// APIError is the body of every refusal.
type APIError struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"` // the task field at fault, as task.json spells it
}

func writeError(w http.ResponseWriter, status int, field, msg string) {
	writeJSON(w, status, APIError{Error: strings.Join(strings.Fields(msg), " "), Field: field})
}

// writeJSON sends v with its length and flushes it: the client has the
// whole answer even while the handler goes on.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error": "encoding the answer failed"}`)
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_ = writeBounded(w, b)
}

// writeDeadline bounds one write of an answer: a client that stops reading
// loses its answer instead of holding its run slot forever. A variable for
// the tests.
var writeDeadline = 30 * time.Second

// writeBounded writes b and flushes it within writeDeadline. The deadline
// is lifted after: the connection may serve the client's next request.
func writeBounded(w http.ResponseWriter, b []byte) error {
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Now().Add(writeDeadline))
	defer rc.SetWriteDeadline(time.Time{})
	if _, err := w.Write(b); err != nil {
		return err
	}
	return rc.Flush()
}
