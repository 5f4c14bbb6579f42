package mcpserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/proxy"
)

// Bounds of calls waiting for the client's decision on a held request.
const (
	// maxHeldCalls bounds the runs of this server waiting for a client's
	// answer at once; more are not asked (their requests are denied).
	maxHeldCalls = 256
	// abandonAfter ends a run whose client was asked and never came back.
	abandonAfter = 10 * time.Minute
)

// heldCall is a run_code call whose run asked for an approval: the run
// goes on beyond the call, and the client's retry of the call (with the
// same RequestState) brings the decision and waits for what comes next.
type heldCall struct {
	asks    chan proxy.Approval
	answers chan answerFor
	result  chan callResult // buffered: the run's end
	done    func()          // ends the run's tracking (and its context)
	cancel  context.CancelFunc

	pending proxy.Approval // the question out to the client
	state   string
	timer   *time.Timer
}

type answerFor struct {
	id string
	d  proxy.Decision
}

type callResult struct {
	res *result.Result
	err error
}

// approve is the run's approver: it hands the question to the call that
// waits (or the next retry) and waits for the answer to that question.
func (h *heldCall) approve(ctx context.Context, _ string, a proxy.Approval) proxy.Decision {
	select {
	case h.asks <- a:
	case <-ctx.Done():
		return proxy.Decision{}
	}
	for {
		select {
		case ans := <-h.answers:
			if ans.id == a.ID {
				return ans.d
			}
		case <-ctx.Done():
			return proxy.Decision{}
		}
	}
}

// heldCalls are the runs waiting for their client's decision, by the
// RequestState given to it.
type heldCalls struct {
	mu sync.Mutex
	m  map[string]*heldCall
}

func (hc *heldCalls) put(h *heldCall) bool {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	if hc.m == nil {
		hc.m = map[string]*heldCall{}
	}
	if len(hc.m) >= maxHeldCalls {
		return false
	}
	hc.m[h.state] = h
	return true
}

func (hc *heldCalls) take(state string) *heldCall {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	h := hc.m[state]
	delete(hc.m, state)
	return h
}

// runAsking runs taskJSON for the call req. A client that can answer
// elicitations is asked to decide the run's held requests: when one
// comes, the call answers with that question (errInputRequired) while
// the run goes on, and the client's retry, with the decision, picks the
// run up again. A retry whose run is gone is told so.
func (s *Server) runAsking(ctx context.Context, req *mcp.CallToolRequest, taskJSON []byte) (*result.Result, *heldCall, error) {
	if req.Params != nil && req.Params.RequestState != "" {
		h := s.held.take(req.Params.RequestState)
		if h == nil {
			return nil, nil, &server.Refusal{Msg: "the approval this call answers is no longer waiting (it timed out, or its run ended)"}
		}
		h.timer.Stop()
		d := proxy.Decision{By: "mcp client (elicitation)"}
		if r, ok := req.Params.InputResponses[h.pending.ID].(*mcp.ElicitResult); ok {
			yes, _ := r.Content["approve"].(bool)
			d.Approved = r.Action == "accept" && yes
		}
		select {
		case h.answers <- answerFor{h.pending.ID, d}:
		default:
		}
		return s.await(ctx, h)
	}
	if !canElicit(req.Session) {
		res, err := s.run(ctx, taskJSON)
		return res, nil, err
	}
	// The run outlives this call: its context ends with the server or the
	// client's session, or when the call is cancelled while waiting.
	runCtx, done := s.track(context.Background(), req.Session)
	runCtx, cancel := context.WithCancel(runCtx)
	h := &heldCall{asks: make(chan proxy.Approval), answers: make(chan answerFor, 1), result: make(chan callResult, 1),
		done: done, cancel: cancel}
	go func() {
		defer done()
		res, err := s.run(server.WithApprover(runCtx, h.approve), taskJSON)
		cancel()
		h.result <- callResult{res, err}
	}()
	return s.await(ctx, h)
}

// await waits for h's run to end or to ask a question; a question becomes
// the call's answer (h returned, and kept in s.held for the retry).
func (s *Server) await(ctx context.Context, h *heldCall) (*result.Result, *heldCall, error) {
	select {
	case r := <-h.result:
		return r.res, nil, r.err
	case a := <-h.asks:
		h.pending = a
		h.state = "rs-" + randomHex(16)
		if !s.held.put(h) {
			select {
			case h.answers <- answerFor{a.ID, proxy.Decision{By: "too many calls waiting for their client"}}:
			default:
			}
			return s.await(ctx, h)
		}
		// A client that never comes back: its run is ended.
		h.timer = time.AfterFunc(abandonAfter, func() {
			if s.held.take(h.state) != nil {
				h.cancel()
			}
		})
		return nil, h, nil
	case <-ctx.Done():
		h.cancel()
		r := <-h.result
		return r.res, nil, r.err
	}
}

// inputRequired is the call's answer that asks the client to decide the
// held request of the last await.
func inputRequired(h *heldCall) *mcp.CallToolResult {
	a := h.pending
	msg := fmt.Sprintf("The sandboxed program asks to send %s %s to service %s.", a.Method, a.URL, a.Service)
	if a.BodyExcerpt != "" {
		msg += "\nBody (start): " + a.BodyExcerpt
	}
	msg += "\nApprove this request?"
	return &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{a.ID: &mcp.ElicitParams{
			Message: msg,
			RequestedSchema: &jsonschema.Schema{Type: "object", Required: []string{"approve"},
				Properties: map[string]*jsonschema.Schema{"approve": {Type: "boolean", Description: "true to let the request through"}}},
		}},
		RequestState: h.state,
	}
}

// canElicit says whether the client of ss answers elicitations.
func canElicit(ss *mcp.ServerSession) bool {
	if ss == nil {
		return false
	}
	ip := ss.InitializeParams()
	return ip != nil && ip.Capabilities != nil && ip.Capabilities.Elicitation != nil
}
