package mcpserver

import (
	"context"
	"sync"
	"time"
)

// maxHeldCalls bounds the calls of a server waiting for a client's answer
// at once; more are not asked (their questions get the answer busy of
// await).
const maxHeldCalls = 256

// abandonAfter ends the work of a call whose client was asked and never
// came back (a variable for tests).
var abandonAfter = 10 * time.Minute

// held is a tool call whose work goes on beyond it while its client is
// asked a question (Q): the call answers with the question (an input
// request, with a RequestState of its own), and the client's retry, with
// the answer (A) and that RequestState, picks the work up again, until
// the work ends with R. serve's run_code holds a run whose request waits
// for approval; a forwarding `agentrun mcp` holds the call to serve that
// serve asked about.
type held[Q, A, R any] struct {
	asks    chan question[Q]
	answers chan reply[A]
	result  chan R // buffered: the work's end
	cancel  context.CancelFunc

	pending question[Q] // the question out to the client
	state   string
	timer   *time.Timer

	mu     sync.Mutex
	asking string // id of the question ask waits on; "" when none
}

type question[Q any] struct {
	id string
	q  Q
}

type reply[A any] struct {
	id string
	a  A
}

// newHeld returns the held call of work that cancel ends.
func newHeld[Q, A, R any](cancel context.CancelFunc) *held[Q, A, R] {
	return &held[Q, A, R]{asks: make(chan question[Q]), answers: make(chan reply[A], 1), result: make(chan R, 1), cancel: cancel}
}

// ask hands q, named id, to the call that waits (or the next retry) and
// waits for the answer to it; false when ctx ends first. An answer that
// answer took (and said so) is returned even when ctx ends at the same
// moment: its client was told it was taken.
func (h *held[Q, A, R]) ask(ctx context.Context, id string, q Q) (A, bool) {
	var zero A
	h.mu.Lock()
	h.asking = id
	h.mu.Unlock()
	select {
	case h.asks <- question[Q]{id, q}:
	case <-ctx.Done():
		h.stopAsking()
		return zero, false
	}
	for {
		select {
		case ans := <-h.answers:
			if ans.id == id {
				return ans.a, true
			}
		case <-ctx.Done():
			if h.stopAsking() {
				return zero, false
			}
			// answer took it: it is in h.answers already.
			for ans := range h.answers {
				if ans.id == id {
					return ans.a, true
				}
			}
		}
	}
}

// stopAsking ends ask's wait; false when an answer was taken first.
func (h *held[Q, A, R]) stopAsking() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	waiting := h.asking != ""
	h.asking = ""
	return waiting
}

// answer gives a the pending question's answer, and says whether it was
// taken: not when one was given already, or ask stopped waiting (its
// time ran out, or its work ended).
func (h *held[Q, A, R]) answer(a A) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.asking == "" || h.asking != h.pending.id {
		return false
	}
	select {
	case h.answers <- reply[A]{h.pending.id, a}: // buffered: one answer per question
		h.asking = ""
		return true
	default:
		return false
	}
}

// heldCalls are the calls waiting for their client's answer, by the
// RequestState given to it.
type heldCalls[Q, A, R any] struct {
	mu sync.Mutex
	m  map[string]*held[Q, A, R]
}

func (hc *heldCalls[Q, A, R]) put(h *held[Q, A, R]) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.m == nil {
		hc.m = map[string]*held[Q, A, R]{}
	}
	if len(hc.m) >= maxHeldCalls {
		return false
	}
	hc.m[h.state] = h
	return true
}

// take returns the call waiting under state, and stops its abandonment;
// nil when none waits (it timed out, or its work ended).
func (hc *heldCalls[Q, A, R]) take(state string) *held[Q, A, R] {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	h := hc.m[state]
	delete(hc.m, state)
	if h != nil {
		h.timer.Stop()
	}
	return h
}

// await waits for h's work to end or to ask a question. A question is
// returned as h (kept for the retry under a new RequestState, its work
// ended if no retry comes within abandonAfter); with maxHeldCalls waiting
// it is answered busy instead. When ctx ends first the work is ended.
func (hc *heldCalls[Q, A, R]) await(ctx context.Context, h *held[Q, A, R], busy A) (R, *held[Q, A, R]) {
	var zero R
	select {
	case r := <-h.result:
		return r, nil
	case q := <-h.asks:
		h.pending = q
		h.state = "rs-" + randomHex(16)
		h.timer = time.AfterFunc(abandonAfter, func() {
			if hc.take(h.state) != nil {
				h.cancel()
			}
		})
		if !hc.put(h) {
			h.timer.Stop()
			h.answer(busy)
			return hc.await(ctx, h, busy)
		}
		return zero, h
	case <-ctx.Done():
		h.cancel()
		return <-h.result, nil
	}
}
