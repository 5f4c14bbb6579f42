// Package server is the HTTP API of `agentrun serve`.
//
//	POST /v1/runs            a task (task.json) in, its result out
//	POST /v1/runs?stream=1   the same as NDJSON events: output as it comes, then the result
//	GET  /healthz            runs going on and waiting, and the warm pool
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
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
)

// RunFunc runs a plan and returns its result, calling the hooks as the run
// goes; runner.Runner.RunWith is one.
type RunFunc func(ctx context.Context, p *task.Plan, hooks runner.Hooks) *result.Result

// Server answers the API. Create it with New.
type Server struct {
	cfg     *config.Config
	run     RunFunc
	pool    func() runner.PoolStats // nil without a pool
	slots   chan struct{}
	queued  atomic.Int64
	running atomic.Int64
	quotas  *quotas
	extra   map[string]http.Handler // more routes, behind the same auth

	// Logf, when set, gets what goes wrong after a client was answered.
	Logf func(format string, args ...any)
}

// New returns a server running tasks with run under cfg's limits and
// policy. pool, if not nil, reports the warm pool for /healthz.
func New(cfg *config.Config, run RunFunc, pool func() runner.PoolStats) *Server {
	return &Server{cfg: cfg, run: run, pool: pool,
		slots:  make(chan struct{}, cfg.Server.MaxConcurrent),
		quotas: newQuotas(cfg.Server.Quota.RunsPerMinute, cfg.Server.Quota.Concurrent, time.Now)}
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/runs", s.postRun)
	mux.HandleFunc("GET /healthz", s.healthz)
	for pattern, h := range s.extra {
		mux.Handle(pattern, h)
	}
	return s.auth(mux)
}

// Handle adds a route to the API (before Handler is called), behind the
// same token: another protocol spoken on the same socket, as /mcp.
func (s *Server) Handle(pattern string, h http.Handler) {
	if s.extra == nil {
		s.extra = map[string]http.Handler{}
	}
	s.extra[pattern] = h
}

// auth requires the bearer token when one is configured.
func (s *Server) auth(next http.Handler) http.Handler {
	token := s.cfg.Server.Token
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="agentrun"`)
			writeError(w, http.StatusUnauthorized, "", "missing or wrong bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) postRun(w http.ResponseWriter, r *http.Request) {
	stream := false
	switch v := r.URL.Query().Get("stream"); v {
	case "", "0", "false":
	case "1", "true":
		stream = true
	default:
		writeError(w, http.StatusBadRequest, "", fmt.Sprintf("stream=%q: want 1 or 0", v))
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, task.MaxTaskBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "reading task: "+err.Error())
		return
	}
	plan, release, err := s.admitTask(r.Context(), data)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	defer release()

	// The answer goes out as soon as the result is final; the slot is
	// held until the sandbox is torn down.
	s.running.Add(1)
	defer s.running.Add(-1)
	var sent *result.Result
	var hooks runner.Hooks
	answer := func(res *result.Result) { writeResult(w, res) }
	if stream {
		ev := newEvents(w)
		defer ev.close()
		hooks.Output = func(stream string, data []byte) {
			ev.send(Event{Event: stream, Data: string(data)})
		}
		answer = func(res *result.Result) {
			ev.send(Event{Event: "result", Result: res})
			ev.close()
		}
	}
	hooks.Result = func(res *result.Result) {
		sent = res
		answer(res)
	}
	final := s.run(r.Context(), plan, hooks)
	if sent == nil {
		answer(final)
	} else if final.Error != sent.Error && s.Logf != nil {
		s.Logf("run %s: after the answer: %s", final.ID, final.Error)
	}
}

func writeResult(w http.ResponseWriter, res *result.Result) {
	status := http.StatusOK
	if res.Error != "" {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, res)
}

// Refusal is a task the server would not run, with the HTTP status that
// says why: 400 bad task, 403 above policy, 413 too large, 429 over a
// session quota, 503 busy. Field names the task field at fault, if one is.
type Refusal struct {
	Status     int
	Field      string
	Msg        string
	RetryAfter time.Duration // when it may be tried again; 0 if not said
}

func (r *Refusal) Error() string { return r.Msg }

// admitTask loads task.json and admits its run: the session's quotas, then
// a run slot. release gives both back; the error is a *Refusal.
func (s *Server) admitTask(ctx context.Context, data []byte) (plan *task.Plan, release func(), err error) {
	if len(data) > task.MaxTaskBytes {
		return nil, nil, &Refusal{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("task is larger than %d bytes", task.MaxTaskBytes)}
	}
	plan, err = task.Load(data, s.cfg)
	if err != nil {
		ref := &Refusal{Status: http.StatusBadRequest, Msg: err.Error()}
		var te *task.Error
		if errors.As(err, &te) {
			ref.Field = te.Field
		}
		if errors.Is(err, task.ErrPolicy) {
			ref.Status = http.StatusForbidden
		}
		return nil, nil, ref
	}
	unquota, retry, err := s.quotas.acquire(plan.Session)
	if err != nil {
		return nil, nil, &Refusal{Status: http.StatusTooManyRequests, Msg: err.Error(), RetryAfter: retry}
	}
	if err := s.admit(ctx); err != nil {
		unquota()
		return nil, nil, &Refusal{Status: http.StatusServiceUnavailable, Msg: err.Error(), RetryAfter: time.Second}
	}
	return plan, func() { <-s.slots; unquota() }, nil
}

// RunTask runs task.json under the server's policy, quotas and admission,
// as POST /v1/runs does, for the server's other doors (MCP). It returns the
// result (Error set when agentrun could not run it), or a *Refusal.
func (s *Server) RunTask(ctx context.Context, data []byte) (*result.Result, error) {
	plan, release, err := s.admitTask(ctx, data)
	if err != nil {
		return nil, err
	}
	defer release()
	s.running.Add(1)
	defer s.running.Add(-1)
	return s.run(ctx, plan, runner.Hooks{}), nil
}

func writeRefusal(w http.ResponseWriter, err error) {
	ref, ok := err.(*Refusal)
	if !ok {
		ref = &Refusal{Status: http.StatusInternalServerError, Msg: err.Error()}
	}
	if ref.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(ref.RetryAfter.Round(time.Second)/time.Second))))
	}
	writeError(w, ref.Status, ref.Field, ref.Msg)
}

// admit takes a run slot, waiting in the queue when all are taken. It
// fails at once when the queue is full, or when ctx ends while waiting.
func (s *Server) admit(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		return nil
	default:
	}
	if s.queued.Add(1) > int64(s.cfg.Server.Queue) {
		s.queued.Add(-1)
		return fmt.Errorf("server busy: %d runs going on and %d waiting, the most it takes", s.cfg.Server.MaxConcurrent, s.cfg.Server.Queue)
	}
	defer s.queued.Add(-1)
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gave up waiting for a run slot: %w", ctx.Err())
	}
}

// Health is the body of GET /healthz.
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
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	h := Health{Status: "ok", Running: s.running.Load(), Queued: s.queued.Load()}
	if s.pool != nil {
		st := s.pool()
		h.Pool = &PoolHealth{Ready: st.Ready, Hits: st.Hits, Misses: st.Misses, LastError: st.LastErr}
	}
	writeJSON(w, http.StatusOK, h)
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
