package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/metrics"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/untrusted"
)

// maxPending bounds the approvals waiting on the whole server; each run's
// proxy holds at most a few of its own.
const maxPending = 1024

// maxRecent is how many of the last decisions the approvals page shows.
const maxRecent = 20

// held is a request held for a decision on the server.
type held struct {
	hold  approvals.Hold
	ch    chan decision // buffered: the first decision wins
	apiBy string        // who an API decision without a label is said to be from
}

// decision is an operator's answer and the channel that brought it.
type decision struct {
	ok          bool
	by, channel string
}

// Decided is one of the last decisions the approvals page shows: the
// held request and who or what decided it ("timeout" included).
type Decided struct {
	approvals.Hold
	Approved bool      `json:"approved"`
	By       string    `json:"by"`
	At       time.Time `json:"at"`
}

// heldSet is the requests held for a decision on the server (those of
// streamed runs, and of unattended runs when server.approvals says how to
// reach a human), by run and approval id, until POST
// /v1/runs/RUN/approvals/ID or the page decides or the proxy stops
// waiting.
type heldSet struct {
	mu      sync.Mutex
	pending map[string]*held // run + "/" + id
	recent  []Decided        // newest first, at most maxRecent
	metrics *metrics.Metrics
}

// ask registers h, announces it (send: the run's stream, hook: the
// webhook, until ctx ends; each may be nil) and waits for the decision,
// or for ctx to end.
func (a *heldSet) ask(ctx context.Context, h *held, send func(Event), hook func(context.Context, approvals.Hold), ap netpolicy.Approval) netpolicy.Decision {
	key := h.hold.Run + "/" + h.hold.ID
	h.ch = make(chan decision, 1)
	a.mu.Lock()
	if a.pending == nil {
		a.pending = map[string]*held{}
	}
	if len(a.pending) >= maxPending {
		a.mu.Unlock()
		return netpolicy.Decision{By: "too many approvals waiting on the server"}
	}
	a.pending[key] = h
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.pending, key)
		a.mu.Unlock()
	}()
	if send != nil {
		send(Event{Event: "approval", Run: h.hold.Run, Approval: &ap})
	}
	if hook != nil {
		hook(ctx, h.hold)
	}
	taken := func(d decision) netpolicy.Decision {
		a.metrics.ApprovalDecided(d.channel, d.ok)
		a.record(h.hold, d.ok, d.by)
		return netpolicy.Decision{Approved: d.ok, By: d.by, Taken: true}
	}
	select {
	case d := <-h.ch:
		return taken(d)
	case <-ctx.Done():
		// A decision that decide took (and answered 200) before this
		// one stops waiting wins over the time running out: it is in
		// h.ch already, put there with the request taken off pending.
		a.mu.Lock()
		_, waiting := a.pending[key]
		delete(a.pending, key)
		a.mu.Unlock()
		if !waiting {
			return taken(<-h.ch)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			a.metrics.ApprovalTimedOut()
			a.record(h.hold, false, "timeout")
		} else {
			a.record(h.hold, false, "request abandoned")
		}
		return netpolicy.Decision{}
	}
}

// record keeps a decision for the page.
func (a *heldSet) record(h approvals.Hold, ok bool, by string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recent = slices.Insert(a.recent, 0, Decided{Hold: h, Approved: ok, By: by, At: time.Now().UTC().Truncate(time.Second)})
	if len(a.recent) > maxRecent {
		a.recent = a.recent[:maxRecent]
	}
}

// decide answers the approval id of run; false when none such waits. by
// "" is the held request's own label for the API.
func (a *heldSet) decide(run, id string, ok bool, by, channel string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	h, found := a.pending[run+"/"+id]
	if !found {
		return false
	}
	delete(a.pending, run+"/"+id)
	if by == "" {
		by = h.apiBy
	}
	h.ch <- decision{ok: ok, by: by, channel: channel}
	return true
}

// held returns the requests waiting, soonest to expire first, and the
// last decisions.
func (a *heldSet) list() ([]approvals.Hold, []Decided) {
	a.mu.Lock()
	defer a.mu.Unlock()
	hs := make([]approvals.Hold, 0, len(a.pending))
	for _, h := range a.pending {
		hs = append(hs, h.hold)
	}
	slices.SortFunc(hs, func(x, y approvals.Hold) int {
		if c := x.ExpiresAt.Compare(y.ExpiresAt); c != 0 {
			return c
		}
		return strings.Compare(x.Run+x.ID, y.Run+y.ID)
	})
	return hs, slices.Clone(a.recent)
}

// count is the number of requests waiting.
func (a *heldSet) count() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return int64(len(a.pending))
}

// approver is the run's Approve hook: the requests of a run in session
// are held on the server, sent on send (a streamed run's events) and
// announced to cfg's webhook. Nil when nothing would reach a human (no
// stream, no webhook, no page): they are then denied at once.
func (s *Server) approver(cfg *config.Config, session string, send func(Event)) func(context.Context, string, netpolicy.Approval) netpolicy.Decision {
	ac := cfg.Server.Approvals
	if send == nil && ac.Webhook == "" && !ac.Page {
		return nil
	}
	apiBy := "operator (serve API)"
	var hook func(context.Context, approvals.Hold)
	if ac.Webhook != "" {
		if send == nil {
			apiBy = "operator (webhook)"
		}
		target := approvals.Target{URL: ac.Webhook, SecretFile: ac.WebhookSecretFile}
		hook = func(ctx context.Context, h approvals.Hold) { s.webhook().Send(ctx, target, h) }
	}
	return func(ctx context.Context, run string, ap netpolicy.Approval) netpolicy.Decision {
		h := &held{hold: approvals.NewHold(ctx, run, session, ap), apiBy: apiBy}
		return s.approvals.ask(ctx, h, send, hook, ap)
	}
}

// webhook is the server's sender of holds, started at first use.
func (s *Server) webhook() *approvals.Webhook {
	s.hookOnce.Do(func() {
		s.hook = approvals.NewWebhook()
		s.hook.Logf = func(format string, args ...any) {
			if s.Logf != nil {
				s.Logf(format, args...)
			}
		}
	})
	return s.hook
}

// Close stops what the server runs in the background (the webhook's
// senders) once it no longer serves.
func (s *Server) Close() {
	s.hookOnce.Do(func() {})
	if s.hook != nil {
		s.hook.Close()
	}
}

// Decision is the body of POST /v1/runs/RUN/approvals/ID. By, optional,
// names who decides (a webhook's receiver passes its user's name): the
// decision is recorded as "operator (serve API: BY)" (apiByName), never as
// a channel's own label; without it, "operator (serve API)", or "operator
// (webhook)" for a request that only the webhook announced.
type Decision struct {
	Approve *bool  `json:"approve"`
	By      string `json:"by,omitempty"`
}

// maxBy bounds Decision.By.
const maxBy = 64

// apiByName is how a decision the API's caller names by is recorded:
// under the API's label, so that "by": "page" or "webhook" is never told
// for a decision of the page's or of the label the webhook's decisions
// get without a name ("operator (page)", "operator (webhook)"). The name
// is escaped (untrusted.Text).
func apiByName(by string) string { return "operator (serve API: " + untrusted.Text(by) + ")" }

func (s *Server) postApproval(w http.ResponseWriter, r *http.Request) {
	run, id := r.PathValue("run"), r.PathValue("id")
	var d Decision
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil || d.Approve == nil {
		writeError(w, http.StatusBadRequest, "approve", `want {"approve": true} or {"approve": false}, and optionally "by": "NAME"`)
		return
	}
	by := ""
	if d.By != "" {
		if len(d.By) > maxBy {
			writeError(w, http.StatusBadRequest, "by", fmt.Sprintf("by is longer than %d bytes", maxBy))
			return
		}
		by = apiByName(d.By)
	}
	if !s.approvals.decide(run, id, *d.Approve, by, metrics.ChannelAPI) {
		writeError(w, http.StatusNotFound, "", fmt.Sprintf("no approval %q of run %q is waiting: it was decided, timed out, or its request ended", id, run))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"run": run, "id": id, "approved": *d.Approve})
}
