package mcpserver

import (
	"context"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
)

// heldRun is a run_code call whose run waits for the client's decision on
// a held request.
type heldRun = held[approvals.Approval, approvals.Decision, callResult]

type callResult struct {
	res *result.Result
	err error
}

// approver is the run's approver of h: it hands the question to the call
// that waits (or the next retry) and waits for the answer (answerClient).
func approver(h *heldRun) runapi.Approver {
	return func(ctx context.Context, _ string, a approvals.Approval) approvals.Decision {
		d, _ := h.ask(ctx, a.ID, a)
		return d
	}
}

// answerClient gives the client's response r (to the question out to it)
// to h, as a decision Taken: it counts from here on, even when the
// approval's time runs out at this moment. False when it came too late.
func answerClient(h *heldRun, r any) bool {
	d := approvals.Decision{By: "mcp client (elicitation)", Taken: true}
	if r, ok := r.(*mcp.ElicitResult); ok {
		yes, _ := r.Content["approve"].(bool)
		d.Approved = r.Action == "accept" && yes
	}
	return h.answer(d)
}

// runAsking runs taskJSON for the call req. A client that can answer
// elicitations is asked to decide the run's held requests: when one
// comes, the call answers with that question (errInputRequired) while
// the run goes on, and the client's retry, with the decision, picks the
// run up again. A retry whose run is gone is told so.
func (s *Server) runAsking(ctx context.Context, req *mcp.CallToolRequest, taskJSON []byte) (*result.Result, *heldRun, error) {
	if req.Params != nil && req.Params.RequestState != "" {
		h := s.held.take(req.Params.RequestState)
		if h == nil {
			return nil, nil, &runapi.Refusal{Msg: "the approval this call answers is no longer waiting (it timed out, or its run ended)"}
		}
		// An answer too late (the approval timed out as the retry came)
		// is not taken: the run's result says so.
		answerClient(h, req.Params.InputResponses[h.pending.id])
		return s.await(ctx, h)
	}
	if !canElicit(req) {
		res, err := s.run(ctx, taskJSON)
		return res, nil, err
	}
	// The run outlives this call: its context ends with the server or the
	// client's session, or when the call is cancelled while waiting.
	runCtx, done := s.track(context.Background(), req.Session)
	runCtx, cancel := context.WithCancel(runCtx)
	h := newHeld[approvals.Approval, approvals.Decision, callResult](cancel)
	go func() {
		defer done()
		res, err := s.run(runapi.WithApprover(runCtx, approver(h)), taskJSON)
		cancel()
		h.result <- callResult{res, err}
	}()
	return s.await(ctx, h)
}

// await waits for h's run to end or to ask a question; a question becomes
// the call's answer (h returned, and kept in s.held for the retry).
func (s *Server) await(ctx context.Context, h *heldRun) (*result.Result, *heldRun, error) {
	r, q := s.held.await(ctx, h, approvals.Decision{By: "too many calls waiting for their client"})
	if q != nil {
		return nil, q, nil
	}
	return r.res, nil, r.err
}

// inputRequired is the call's answer that asks the client to decide the
// held request (or tool call) of the last await. The question carries the tag of a call
// that a forwarding `agentrun mcp` made (forwardedCallKey), which tells it
// which of its calls is asked.
func inputRequired(h *heldRun, tag string) *mcp.CallToolResult {
	a := h.pending.q
	msg := "agentrun: " + a.Describe() + "Approve this " + a.Noun() + "?"
	return &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{a.ID: &mcp.ElicitParams{
			Meta:    forwardedTag(tag),
			Message: msg,
			RequestedSchema: &jsonschema.Schema{Type: "object", Required: []string{"approve"},
				Properties: map[string]*jsonschema.Schema{"approve": {Type: "boolean", Description: "true to let the " + a.Noun() + " through"}}},
		}},
		RequestState: h.state,
	}
}

// canElicit says whether the client of req answers elicitations: as the
// request says (current protocol versions, and a forwarding `agentrun
// mcp` for its own client), else as the session's initialization said.
func canElicit(req *mcp.CallToolRequest) bool {
	caps := req.ClientCapabilities()
	return caps != nil && caps.Elicitation != nil
}
