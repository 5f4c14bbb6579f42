package mcpserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// keepAlive is how often a forwarding server pings serve, which keeps its
// session there from being closed as idle.
const keepAlive = time.Minute

// Forward returns a server that offers the tools of serve's /mcp, reached
// through transport (a Streamable HTTP client), and forwards every call
// there: an unprivileged `agentrun mcp` runs code through serve, which
// applies its own config, policy, quotas (the session is serve's MCP
// session) and audit. It fails when serve cannot be reached. A session
// with serve that ended (serve restarted) is opened again at the next
// call; a call that fails is never sent twice.
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
			ctx, done := s.track(ctx, req.Session)
			defer done()
			cs, err := r.session(ctx)
			var res *mcp.CallToolResult
			if err == nil {
				res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: req.Params.Arguments})
			}
			switch {
			case ctx.Err() != nil:
				return cancelled(), nil
			case err != nil:
				s.logf("forwarding %s to agentrun serve: %v", name, err)
				return hostFailure(""), nil
			}
			return res, nil
		})
	}
	return s, nil
}

// remote is the session with serve, opened again when it ended.
type remote struct {
	transport mcp.Transport

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
	client := mcp.NewClient(&mcp.Implementation{Name: "agentrun-mcp", Version: Version}, &mcp.ClientOptions{KeepAlive: keepAlive})
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
