package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/agentrun/agentrun/proxy"
)

// maxPending bounds the approvals waiting on the whole server; each run's
// proxy holds at most a few of its own.
const maxPending = 1024

// approvals are the requests held for a decision that streamed runs have
// asked about, by run and approval id, until POST
// /v1/runs/RUN/approvals/ID decides or the proxy stops waiting.
type approvals struct {
	mu      sync.Mutex
	pending map[string]chan bool // run + "/" + id
}

// ask sends the approval event through send and waits for the decision,
// or for ctx to end.
func (a *approvals) ask(ctx context.Context, run string, ap proxy.Approval, send func(Event)) proxy.Decision {
	key := run + "/" + ap.ID
	ch := make(chan bool, 1)
	a.mu.Lock()
	if a.pending == nil {
		a.pending = map[string]chan bool{}
	}
	if len(a.pending) >= maxPending {
		a.mu.Unlock()
		return proxy.Decision{By: "too many approvals waiting on the server"}
	}
	a.pending[key] = ch
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.pending, key)
		a.mu.Unlock()
	}()
	send(Event{Event: "approval", Run: run, Approval: &ap})
	select {
	case ok := <-ch:
		return proxy.Decision{Approved: ok, By: "operator (serve API)"}
	case <-ctx.Done():
		return proxy.Decision{}
	}
}

// decide answers the approval id of run; false when none such waits.
func (a *approvals) decide(run, id string, ok bool) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch, found := a.pending[run+"/"+id]
	if !found {
		return false
	}
	delete(a.pending, run+"/"+id)
	ch <- ok
	return true
}

type approverKey struct{}

// Approver decides a request of run held for approval; it must return
// when ctx ends.
type Approver = func(ctx context.Context, run string, a proxy.Approval) proxy.Decision

// WithApprover returns ctx carrying approve, which RunTask asks about the
// run's requests held for approval (MCP elicitation, a terminal).
func WithApprover(ctx context.Context, approve Approver) context.Context {
	return context.WithValue(ctx, approverKey{}, approve)
}

func approverFrom(ctx context.Context) Approver {
	a, _ := ctx.Value(approverKey{}).(Approver)
	return a
}

// Decision is the body of POST /v1/runs/RUN/approvals/ID.
type Decision struct {
	Approve *bool `json:"approve"`
}

func (s *Server) postApproval(w http.ResponseWriter, r *http.Request) {
	run, id := r.PathValue("run"), r.PathValue("id")
	var d Decision
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil || d.Approve == nil {
		writeError(w, http.StatusBadRequest, "approve", `want {"approve": true} or {"approve": false}`)
		return
	}
	if !s.approvals.decide(run, id, *d.Approve) {
		writeError(w, http.StatusNotFound, "", fmt.Sprintf("no approval %q of run %q is waiting: it was decided, timed out, or its request ended", id, run))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"run": run, "id": id, "approved": *d.Approve})
}
