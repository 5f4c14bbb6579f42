package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/metrics"
)

// approver is the run's Approve hook: the requests of a run in session
// are held on the server, sent on send (a streamed run's events) and
// announced to cfg's webhook. Nil when nothing would reach a human (no
// stream, no webhook, no page): they are then denied at once.
func (s *Server) approver(cfg *config.Config, session string, send func(Event)) approvals.RunFunc {
	ac := cfg.Server.Approvals
	if send == nil && ac.Webhook == "" && !ac.Page {
		return nil
	}
	apiBy := approvals.Operator(approvals.ViaAPI, "")
	var target *approvals.Target
	if ac.Webhook != "" {
		if send == nil {
			apiBy = approvals.Operator(approvals.ViaWebhook, "")
		}
		target = &approvals.Target{URL: ac.Webhook, SecretFile: ac.WebhookSecretFile}
	}
	return func(ctx context.Context, run string, ap approvals.Approval) approvals.Decision {
		h := approvals.NewHold(ctx, run, session, ap)
		return s.holds.Ask(ctx, h, apiBy, func() {
			if send != nil {
				send(Event{Event: "approval", Run: run, Approval: &ap})
			}
			if target != nil {
				s.webhook().Send(ctx, *target, h)
			}
		})
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
// decision is recorded as "operator (serve API: BY)" (approvals.Operator),
// never as a channel's own label; without it, "operator (serve API)", or
// "operator (webhook)" for a request that only the webhook announced.
type Decision struct {
	Approve *bool  `json:"approve"`
	By      string `json:"by,omitempty"`
}

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
		if len(d.By) > approvals.MaxName {
			writeError(w, http.StatusBadRequest, "by", fmt.Sprintf("by is longer than %d bytes", approvals.MaxName))
			return
		}
		by = approvals.Operator(approvals.ViaAPI, d.By)
	}
	if !s.holds.Decide(run, id, *d.Approve, by, metrics.ChannelAPI) {
		writeError(w, http.StatusNotFound, "", fmt.Sprintf("no approval %q of run %q is waiting: it was decided, timed out, or its request ended", id, run))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"run": run, "id": id, "approved": *d.Approve})
}
