package mcpserver

import (
	"context"
	"fmt"
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
// session) and audit. It fails when serve cannot be reached.
func Forward(ctx context.Context, transport mcp.Transport, logf func(format string, args ...any)) (*Server, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "agentrun-mcp", Version: Version}, &mcp.ClientOptions{KeepAlive: keepAlive})
	remote, err := client.Connect(ctx, transport, nil)
	if err != nil {
		return nil, fmt.Errorf("connecting to agentrun serve's /mcp: %w", err)
	}
	s := newServer(logf, remote.InitializeResult().Instructions)
	context.AfterFunc(s.stop, func() { remote.Close() })
	for tool, err := range remote.Tools(ctx, nil) {
		if err != nil {
			remote.Close()
			return nil, fmt.Errorf("listing serve's tools: %w", err)
		}
		name := tool.Name
		s.mcp.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			ctx, done := s.track(ctx)
			defer done()
			res, err := remote.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: req.Params.Arguments})
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
