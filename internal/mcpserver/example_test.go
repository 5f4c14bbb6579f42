package mcpserver_test

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/mcpserver"
	"github.com/agentrun/agentrun/internal/result"
)

// A server whose runs are answered by a fixed result (serve passes
// server.Server.RunTask), called by the SDK's client in memory.
func Example() {
	run := func(ctx context.Context, taskJSON []byte) (*result.Result, error) {
		return &result.Result{ID: "ar-1", ExitCode: 3, Stdout: "45\n", DurationMS: 12}, nil
	}
	s := mcpserver.New(config.Default(), run, func(string, ...any) {})
	defer s.Close()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := s.MCP().Connect(context.Background(), st, nil); err != nil {
		panic(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "example", Version: "0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		panic(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpserver.ToolName, Arguments: map[string]any{"code": "print(45)"}})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.IsError)
	fmt.Println(res.Content[0].(*mcp.TextContent).Text)
	// Output:
	// false
	// stdout:
	// 45
	// [exit code 3, 12 ms; run ar-1]
}
