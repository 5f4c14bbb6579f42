package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentrun/agentrun/internal/approvals"
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
	By      string `json:"by,omitempty"` // who decides; recorded as "operator (nats: BY)" (approvals.Operator)
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

// decisionOf is the decision a Decision message data takes.
func decisionOf(data []byte) (approvals.Decision, error) {
	var d Decision
	if err := json.Unmarshal(data, &d); err != nil || len(d.By) > approvals.MaxName {
		return approvals.Decision{}, fmt.Errorf(`want {"approve": true|false, "by": NAME of at most %d bytes}`, approvals.MaxName)
	}
	return approvals.Decision{Approved: d.Approve, By: approvals.Operator(approvals.ViaNATS, d.By), Taken: true}, nil
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
		var slot approvals.Slot
		sub, err := w.nc.Subscribe(DecisionSubject(ac.Subject, a.ID), func(m *nats.Msg) {
			d, err := decisionOf(m.Data)
			if err != nil {
				reply(m, DecisionReply{Error: err.Error()})
				return
			}
			if !slot.Take(d) {
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
		return slot.Wait(ctx)
	}
}

func reply(m *nats.Msg, r DecisionReply) {
	b, _ := json.Marshal(r)
	_ = m.Respond(b)
}
