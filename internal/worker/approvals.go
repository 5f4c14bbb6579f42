package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/untrusted"
)

// A worker's requests held for approval (worker.approvals): each is
// announced to the webhook, and the worker that holds it listens on
// SUBJECT.ID (the approval id, 64 random bits: only that worker listens)
// for the time it is held. `agentrun approve` sends a Decision there as a
// request and gets the worker's DecisionReply; no reply (no responders)
// means no worker holds it any more. Unanswered, it is denied at
// network.approval_timeout. Whoever may publish on the subject decides:
// the bus is trusted as it is for the tasks themselves.

// Decision is the message that decides a held request.
type Decision struct {
	Approve bool   `json:"approve"`
	By      string `json:"by,omitempty"` // who decides; recorded as "operator (nats: BY)" (natsBy)
}

// DecisionReply is the holding worker's answer to a Decision: the run
// and the decision taken, or Error (the request is no longer held, or the
// message was not a Decision).
type DecisionReply struct {
	Run      string `json:"run,omitempty"`
	Approved bool   `json:"approved"`
	By       string `json:"by,omitempty"`
	Error    string `json:"error,omitempty"`
}

// maxBy bounds Decision.By.
const maxBy = 64

// decisionOf is the decision a Decision message data takes.
func decisionOf(data []byte) (approvals.Decision, error) {
	var d Decision
	if err := json.Unmarshal(data, &d); err != nil || len(d.By) > maxBy {
		return approvals.Decision{}, fmt.Errorf(`want {"approve": true|false, "by": NAME of at most %d bytes}`, maxBy)
	}
	return approvals.Decision{Approved: d.Approve, By: natsBy(d.By), Taken: true}, nil
}

// natsBy is how a decision that came over NATS naming by is recorded:
// "operator (nats: BY)", or "operator (nats)" without a name. The name
// is the operator's own words and is kept under the channel's label, so
// that it never reads as a channel's ("--by page" is not "operator
// (page)", the approvals page's label), the shape serve's API gives a
// name ("operator (serve API: BY)"). It is escaped as untrusted text.
func natsBy(by string) string {
	if by == "" {
		return "operator (nats)"
	}
	return "operator (nats: " + untrusted.Text(by) + ")"
}

// DecisionSubject is the subject on which approval id is decided.
func DecisionSubject(prefix, id string) string { return prefix + "." + id }

// approver is the Approve hook of a run in session: nil without a
// webhook (nobody would know to decide: denied at once).
func (w *Worker) approver(session string) approvals.RunFunc {
	ac := w.wc.Approvals
	if ac.Webhook == "" || w.hook == nil {
		return nil
	}
	target := approvals.Target{URL: ac.Webhook, SecretFile: ac.WebhookSecretFile}
	return func(ctx context.Context, run string, a approvals.Approval) approvals.Decision {
		var slot decisionSlot
		sub, err := w.nc.Subscribe(DecisionSubject(ac.Subject, a.ID), func(m *nats.Msg) {
			d, err := decisionOf(m.Data)
			if err != nil {
				reply(m, DecisionReply{Error: err.Error()})
				return
			}
			if !slot.take(d) {
				reply(m, DecisionReply{Run: run, Error: "no longer held: it was decided, timed out, or its request ended"})
				return
			}
			reply(m, DecisionReply{Run: run, Approved: d.Approved, By: d.By})
		})
		if err != nil {
			w.Logf("approval %s of run %s: subscribing to its decisions: %v: denied", a.ID, run, err)
			return approvals.Decision{By: "no way to ask (NATS)"}
		}
		defer sub.Unsubscribe()
		// Listening before the announcement: a decision never comes
		// before the subscription.
		_ = w.nc.FlushTimeout(5 * time.Second)
		w.hook.Send(ctx, target, approvals.NewHold(ctx, run, session, a))
		return slot.wait(ctx)
	}
}

// decisionSlot takes the first decision on a held request, until its
// waiter stops waiting: a decision taken (and replied to as taken) is the
// one returned, even when ctx ends at the same moment.
type decisionSlot struct {
	mu     sync.Mutex
	closed bool
	d      approvals.Decision
	got    chan struct{}
	once   sync.Once
}

func (s *decisionSlot) init() { s.once.Do(func() { s.got = make(chan struct{}) }) }

// take keeps d unless a decision was taken or the waiter stopped
// waiting; it says whether d was taken.
func (s *decisionSlot) take(d approvals.Decision) bool {
	s.init()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed, s.d = true, d
	close(s.got)
	return true
}

// wait returns the decision taken, or the zero Decision once ctx ends
// with none taken (later ones are then refused).
func (s *decisionSlot) wait(ctx context.Context) approvals.Decision {
	s.init()
	select {
	case <-s.got:
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.d
}

func reply(m *nats.Msg, r DecisionReply) {
	b, _ := json.Marshal(r)
	_ = m.Respond(b)
}
