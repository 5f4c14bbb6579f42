package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/metrics"
)

// quotaWindow is the span runs_per_minute counts over.
const quotaWindow = time.Minute

// sweepAt is how many sessions the quota table holds before idle ones are
// dropped. After a sweep the next one waits until the table has twice as
// many sessions as the sweep left (and at least sweepAt): admissions scan
// it, under the lock, about once per session added, however many of its
// sessions are still in their window.
const sweepAt = 4096

// quotas bounds each session's runs per minute and concurrent runs. A task
// without a session shares the "" session with every other such task.
type quotas struct {
	perMinute, concurrent int // 0: no bound
	now                   func() time.Time

	mu        sync.Mutex
	sessions  map[string]*use
	sweepNext int // the table's size that makes the next sweep
	sweeps    int // sweeps so far
}

// use is one session's recent starts (oldest first) and running runs.
type use struct {
	starts  []time.Time
	running int
}

func newQuotas(perMinute, concurrent int, now func() time.Time) *quotas {
	return &quotas{perMinute: perMinute, concurrent: concurrent, now: now, sessions: map[string]*use{}, sweepNext: sweepAt}
}

// set changes the bounds; runs counted so far stay counted.
func (q *quotas) set(perMinute, concurrent int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.perMinute, q.concurrent = perMinute, concurrent
}

// quotaError is a refusal by one quota, named as the metrics name it.
type quotaError struct {
	quota string
	msg   string
}

func (e *quotaError) Error() string { return e.msg }

// Kind is errkind.Quota.
func (e *quotaError) Kind() errkind.Kind { return errkind.Quota }

// acquire counts a run of session, or says why it may not start (a
// *quotaError) and when it may be tried again. release ends the run.
func (q *quotas) acquire(session string) (release func(), retry time.Duration, err error) {
	h, retry, err := q.take(session)
	if err != nil {
		return nil, retry, err
	}
	return h.release, 0, nil
}

// quotaHold is a run counted against its session's quota.
type quotaHold struct {
	q     *quotas
	u     *use
	start time.Time // zero without runs_per_minute
	once  sync.Once
}

// release ends the run; again is nothing.
func (h *quotaHold) release() { h.end(false) }

// undo takes the run back as if it had not been counted, start included:
// it never started (no run slot). Again, or after release, is nothing.
func (h *quotaHold) undo() { h.end(true) }

func (h *quotaHold) end(undo bool) {
	h.once.Do(func() {
		h.q.mu.Lock()
		defer h.q.mu.Unlock()
		h.u.running--
		if !undo || h.start.IsZero() {
			return
		}
		// The latest start at that time, if it is still in the window.
		for i := len(h.u.starts) - 1; i >= 0; i-- {
			if h.u.starts[i].Equal(h.start) {
				h.u.starts = append(h.u.starts[:i], h.u.starts[i+1:]...)
				return
			}
		}
	})
}

// take is acquire's count, which the hold can undo.
func (q *quotas) take(session string) (_ *quotaHold, retry time.Duration, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if len(q.sessions) >= q.sweepNext {
		for name, u := range q.sessions {
			if u.prune(now); u.running == 0 && len(u.starts) == 0 {
				delete(q.sessions, name)
			}
		}
		q.sweeps++
		q.sweepNext = max(sweepAt, 2*len(q.sessions))
	}
	u := q.sessions[session]
	if u == nil {
		u = &use{}
		q.sessions[session] = u
	}
	u.prune(now)
	if q.perMinute > 0 && len(u.starts) >= q.perMinute {
		return nil, u.starts[0].Add(quotaWindow).Sub(now), &quotaError{metrics.QuotaPerMinute,
			fmt.Sprintf("session %q is over its quota of %d runs per minute", session, q.perMinute)}
	}
	if q.concurrent > 0 && u.running >= q.concurrent {
		return nil, time.Second, &quotaError{metrics.QuotaConcurrent,
			fmt.Sprintf("session %q already has %d runs going on, its quota", session, q.concurrent)}
	}
	h := &quotaHold{q: q, u: u}
	if q.perMinute > 0 {
		h.start = now
		u.starts = append(u.starts, now)
	}
	u.running++
	return h, 0, nil
}

// prune drops the starts that left the window.
func (u *use) prune(now time.Time) {
	i := 0
	for i < len(u.starts) && now.Sub(u.starts[i]) >= quotaWindow {
		i++
	}
	u.starts = u.starts[i:]
}
