package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// keepAlive is how often a forwarding server pings serve, which keeps its
// session there from being closed as idle.
const keepAlive = time.Minute

// forwardedCallKey is the _meta key of a call that a forwarding server
// makes at serve, and of the elicitations serve sends for it: a tag that
// tells the forwarding server which of its calls serve asks about.
const forwardedCallKey = "agentrun/forwarded-call"

// Forward returns a server that offers the tools of serve's /mcp, reached
// through transport (a Streamable HTTP client), and forwards every call
// there: an unprivileged `agentrun mcp` runs code through serve, which
// applies its own config, policy, quotas (the session is serve's MCP
// session) and audit. It fails when serve cannot be reached. A session
// with serve that ended (serve restarted) is opened again at the next
// call; a call that fails is never sent twice.
//
// serve's questions about requests held for approval reach the client.
// Each call tells serve the client's own capabilities, so that serve asks
// only a client that answers elicitations, as it does its own clients.
// serve asks through an elicitation (its session with this server is on a
// protocol version before input requests), which the call's tag names;
// the call then answers its client with the question as an input request,
// and the client's retry brings the answer back to serve, whose decision
// is recorded as the client's.
func Forward(ctx context.Context, transport mcp.Transport, logf func(format string, args ...any)) (*Server, error) {
	r := &remote{transport: transport}
	cs, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	s := newServer(logf, cs.InitializeResult().Instructions)
	s.after = r.close // once the calls are cancelled there
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			r.close()
			return nil, fmt.Errorf("listing serve's tools: %w", err)
		}
		name := tool.Name
		s.mcp.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return r.call(s, ctx, name, req), nil
		})
	}
	return s, nil
}

// heldForward is a call forwarded to serve that serve asks a question
// about.
type heldForward = held[*mcp.ElicitParams, *mcp.ElicitResult, forwardResult]

type forwardResult struct {
	res *mcp.CallToolResult
	err error
}

// call forwards req, a call of tool name, to serve, or, when req is the
// client's retry with an answer, hands the answer to the call at serve
// that waits for it. The call at serve goes on beyond req while the
// client is asked.
func (r *remote) call(s *Server, ctx context.Context, name string, req *mcp.CallToolRequest) *mcp.CallToolResult {
	ctx, done := s.track(ctx, req.Session)
	defer done()
	var h *heldForward
	if req.Params.RequestState != "" {
		if h = r.held.take(req.Params.RequestState); h == nil {
			return errorResult("run_code refused: the question this call answers is no longer waiting (its run ended, or the answer came too late)")
		}
		a, _ := req.Params.InputResponses[h.pending.id].(*mcp.ElicitResult)
		if a == nil {
			a = &mcp.ElicitResult{Action: "decline"}
		}
		h.answer(a)
	} else {
		// The call at serve outlives req: it ends with this server or the
		// client's session, or when a call waiting for it is cancelled.
		callCtx, untrack := s.track(context.Background(), req.Session)
		callCtx, cancel := context.WithCancel(callCtx)
		h = newHeld[*mcp.ElicitParams, *mcp.ElicitResult, forwardResult](cancel)
		tag := "fc-" + randomHex(16)
		r.running.Store(tag, running{h, callCtx})
		go func() {
			defer untrack()
			defer r.running.Delete(tag)
			cs, err := r.session(callCtx)
			var res *mcp.CallToolResult
			if err == nil {
				res, err = cs.CallTool(callCtx, forwarded(name, req, tag))
			}
			cancel()
			h.result <- forwardResult{res, err}
		}()
	}
	out, q := r.held.await(ctx, h, &mcp.ElicitResult{Action: "decline"})
	switch {
	case q != nil:
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{q.pending.id: q.pending.q}, RequestState: q.state}
	case ctx.Err() != nil:
		return cancelled()
	case out.err != nil:
		s.logf("forwarding %s to agentrun serve: %v", name, out.err)
		return hostFailure(ToolName, "")
	}
	return out.res
}

// running is a call at serve going on, by its tag.
type running struct {
	h   *heldForward
	ctx context.Context // ends with the call
}

// elicit is serve's question about the call its tag names: the call asks
// its client, and the client's answer is serve's. A question about no
// call of this server is declined.
func (r *remote) elicit(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	tag, _ := req.Params.Meta[forwardedCallKey].(string)
	v, ok := r.running.Load(tag)
	if !ok || !strings.HasPrefix(tag, "fc-") {
		return &mcp.ElicitResult{Action: "decline"}, nil
	}
	c := v.(running)
	ctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(c.ctx, cancel)()
	q := *req.Params
	q.Meta = nil
	a, ok := c.h.ask(ctx, "in-"+randomHex(8), &q)
	if !ok {
		return nil, fmt.Errorf("the call asked about ended")
	}
	return a, nil
}

// forwarded is req as the call to make at serve: its arguments, its tag,
// and the capabilities of the client of req, which tell serve whether it
// may ask.
func forwarded(name string, req *mcp.CallToolRequest, tag string) *mcp.CallToolParams {
	caps := req.ClientCapabilities()
	if caps == nil {
		caps = &mcp.ClientCapabilities{}
	}
	return &mcp.CallToolParams{
		Meta:      mcp.Meta{mcp.MetaKeyClientCapabilities: caps, forwardedCallKey: tag},
		Name:      name,
		Arguments: req.Params.Arguments,
	}
}

// callTag is the tag of req when a forwarding server made it.
func callTag(req *mcp.CallToolRequest) string {
	if req.Params == nil {
		return ""
	}
	tag, _ := req.Params.Meta[forwardedCallKey].(string)
	return tag
}

// forwardedTag is the _meta of a question about the call tagged tag.
func forwardedTag(tag string) mcp.Meta {
	if tag == "" {
		return nil
	}
	return mcp.Meta{forwardedCallKey: tag}
}

// remote is the session with serve, opened again when it ended, and the
// calls forwarded there.
type remote struct {
	transport mcp.Transport

	running sync.Map // tag -> running: the calls at serve going on
	held    heldCalls[*mcp.ElicitParams, *mcp.ElicitResult, forwardResult]

	mu    sync.Mutex
	cs    *mcp.ClientSession
	ended chan struct{} // closed when cs has ended
}

// session returns the session with serve, opening one if there is none
// or the last one ended.
func (r *remote) session(ctx context.Context) (*mcp.ClientSession, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cs != nil {
		select {
		case <-r.ended:
		default:
			return r.cs, nil
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "agentrun-mcp", Version: Version},
		&mcp.ClientOptions{KeepAlive: keepAlive, ElicitationHandler: r.elicit})
	cs, err := client.Connect(ctx, r.transport, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to agentrun serve's /mcp: %w", err)
	}
	ended := make(chan struct{})
	go func() { cs.Wait(); close(ended) }()
	r.cs, r.ended = cs, ended
	return cs, nil
}

func (r *remote) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cs != nil {
		r.cs.Close()
	}
}
