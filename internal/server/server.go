// Package server is the HTTP API of `agentrun serve`.
//
//	POST /v1/runs            a task (task.json) in, its result out
//	POST /v1/runs?stream=1   the same as NDJSON events: output as it comes, then the result
//	GET  /healthz            runs going on and waiting, and the warm pool
//	GET  /metrics            the same and more, in the Prometheus text format
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
	"github.com/agentrun/agentrun/internal/metrics"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runner"
	"github.com/agentrun/agentrun/internal/task"
)

// RunFunc runs a plan and returns its result, calling the hooks as the run
// goes; runner.Runner.RunWith is one.
type RunFunc func(ctx context.Context, p *task.Plan, hooks runner.Hooks) *result.Result

// Server answers the API. Create it with New.
type Server struct {
	cfg     atomic.Pointer[config.Config] // replaced by Reload
	run     RunFunc
	pool    func() runner.PoolStats // nil without a pool
	slots   atomic.Pointer[chan struct{}]
	queued  atomic.Int64
	running atomic.Int64
	quotas  *quotas
	metrics *metrics.Metrics

	// Logf, when set, gets what goes wrong after a client was answered.
	Logf func(format string, args ...any)
}

// New returns a server running tasks with run under cfg's limits and
// policy. pool, if not nil, reports the warm pool for /healthz.
func New(cfg *config.Config, run RunFunc, pool func() runner.PoolStats) *Server {
	s := &Server{run: run, pool: pool,
		quotas: newQuotas(cfg.Server.Quota.RunsPerMinute, cfg.Server.Quota.Concurrent, time.Now)}
	s.cfg.Store(cfg)
	slots := make(chan struct{}, cfg.Server.MaxConcurrent)
	s.slots.Store(&slots)
	g := metrics.Gauges{Running: s.running.Load, Queued: s.queued.Load}
	if pool != nil {
		g.Pool = func() metrics.PoolStats {
			st := pool()
			ms := metrics.PoolStats{Ready: map[string]int64{}, Hits: st.ImageHits, Misses: st.ImageMisses}
			for ref, n := range st.Ready {
				ms.Ready[ref] = int64(n)
			}
			return ms
		}
	}
	s.metrics = metrics.New(g)
	return s
}

// Reload makes cfg the config of the runs admitted from now on: its task
// defaults and policy, server.max_concurrent, server.queue, server.quota
// and server.token. Runs going on keep theirs; they do not count against
// a new max_concurrent. cfg must be valid.
func (s *Server) Reload(cfg *config.Config) {
	old := s.cfg.Load()
	if cfg.Server.MaxConcurrent != old.Server.MaxConcurrent {
		slots := make(chan struct{}, cfg.Server.MaxConcurrent)
		s.slots.Store(&slots)
	}
	s.quotas.set(cfg.Server.Quota.RunsPerMinute, cfg.Server.Quota.Concurrent)
	s.cfg.Store(cfg)
}

// Handler is the API's HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/runs", s.postRun)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /metrics", s.serveMetrics)
	return s.auth(mux)
}

// auth requires the bearer token when one is configured.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := s.cfg.Load().Server.Token
		if token == "" {
			next.ServeHTTP(w, r)
			return
		}
		want := []byte("Bearer " + token)
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
	cfg := s.cfg.Load() // the whole request is under one config
	data, err := io.ReadAll(io.LimitReader(r.Body, task.MaxTaskBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "", "reading task: "+err.Error())
		return
	}
	if len(data) > task.MaxTaskBytes {
		s.metrics.Refused(cfg.Runtime, "")
		writeError(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("task is larger than %d bytes", task.MaxTaskBytes))
		return
	}
	plan, err := task.Load(data, cfg)
	if err != nil {
		s.metrics.Refused(cfg.Runtime, "")
		status, field := http.StatusBadRequest, ""
		var te *task.Error
		if errors.As(err, &te) {
			field = te.Field
		}
		if errors.Is(err, task.ErrPolicy) {
			status = http.StatusForbidden
		}
		writeError(w, status, field, err.Error())
		return
	}

	release, retry, err := s.quotas.acquire(plan.Session)
	if err != nil {
		quota := ""
		if qe := (*quotaError)(nil); errors.As(err, &qe) {
			quota = qe.quota
		}
		s.metrics.Refused(plan.Runtime, quota)
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Round(time.Second)/time.Second)))
		writeError(w, http.StatusTooManyRequests, "", err.Error())
		return
	}
	defer release()
	slots, err := s.admit(r.Context(), cfg)
	if err != nil {
		quota := ""
		if errors.Is(err, errQueueFull) {
			quota = metrics.QuotaQueue
		}
		s.metrics.Refused(plan.Runtime, quota)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "", err.Error())
		return
	}
	defer func() { <-slots }()

	// The answer goes out as soon as the result is final; the slot is
	// held until the sandbox is torn down.
	s.running.Add(1)
	defer s.running.Add(-1)
	var sent *result.Result
	var hooks runner.Hooks
	admitted, pooled := time.Now(), false
	hooks.Setup = func(p bool, d time.Duration) {
		pooled = p
		s.metrics.Setup(p, d)
	}
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
		s.metrics.Ran(plan.Runtime, pooled, time.Since(admitted), res)
		answer(res)
	}
	final := s.run(r.Context(), plan, hooks)
	if sent == nil {
		s.metrics.Ran(plan.Runtime, pooled, time.Since(admitted), final)
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

// errQueueFull is admit's refusal when the queue is full.
var errQueueFull = errors.New("server busy")

// admit takes a run slot, waiting in the queue when all are taken. It
// fails at once when the queue is full, or when ctx ends while waiting.
// The slot is freed by a receive from the channel it returns.
func (s *Server) admit(ctx context.Context, cfg *config.Config) (chan struct{}, error) {
	slots := *s.slots.Load()
	select {
	case slots <- struct{}{}:
		return slots, nil
	default:
	}
	if s.queued.Add(1) > int64(cfg.Server.Queue) {
		s.queued.Add(-1)
		return nil, fmt.Errorf("%w: %d runs going on and %d waiting, the most it takes", errQueueFull, cfg.Server.MaxConcurrent, cfg.Server.Queue)
	}
	defer s.queued.Add(-1)
	select {
	case slots <- struct{}{}:
		return slots, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("gave up waiting for a run slot: %w", ctx.Err())
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
