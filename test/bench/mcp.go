package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Names of the MCP contenders.
const (
	mcpColdName = "agentrun mcp, cold (runs here)"
	mcpWarmName = "agentrun mcp → serve, warm pool"
)

// mcpSession is a running `agentrun mcp` and the Go SDK's client of it.
type mcpSession struct {
	cs *mcp.ClientSession
}

// startMCP starts `agentrun mcp` with args and connects to it over stdio.
func startMCP(args ...string) (*mcpSession, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.Command(*bin, append([]string{"mcp"}, args...)...)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "0"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, fmt.Errorf("agentrun mcp %v: %w", args, err)
	}
	return &mcpSession{cs: cs}, nil
}

// call45 calls run_code with print(45) and returns the program's stdout.
func (m *mcpSession) call45() (string, error) {
	res, err := m.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "print(45)"}})
	if err != nil {
		return "", err
	}
	out, _ := res.StructuredContent.(map[string]any)
	if res.IsError || out == nil {
		return "", fmt.Errorf("error answer: %v", res.Content)
	}
	stdout, _ := out["stdout"].(string)
	return stdout, nil
}

func (m *mcpSession) close() {
	if m != nil {
		m.cs.Close()
	}
}

// mcpColdContender times a tools/call round trip of print(45) over stdio
// to one `agentrun mcp` that runs tasks itself: a cold sandbox per call,
// without a process start per call.
func mcpColdContender(cfg string) (*contender, *mcpSession) {
	c := &contender{name: mcpColdName, note: "tools/call over stdio (Go SDK client) to one `agentrun mcp` process, root, no server: a cold sandbox per call"}
	m, err := startMCP("--local", "--config", cfg)
	if err != nil {
		c.err = err.Error()
		return c, nil
	}
	c.call = func(int) (time.Duration, string, error) {
		start := time.Now()
		out, err := m.call45()
		return time.Since(start), out, err
	}
	return c, m
}

// mcpWarmContender times the same round trip to an `agentrun mcp` that
// forwards to serve's /mcp, with a sandbox ready in serve's pool.
func mcpWarmContender(s *served, serr error) (*contender, *mcpSession) {
	c := &contender{name: mcpWarmName, note: "tools/call over stdio to one `agentrun mcp` that forwards to serve's /mcp over the socket, a sandbox ready in the pool"}
	if serr != nil {
		c.err = serr.Error()
		return c, nil
	}
	m, err := startMCP("--server", "unix://"+s.sock)
	if err != nil {
		c.err = err.Error()
		return c, nil
	}
	return s.pooled(c, nil, m.call45), m
}

// mcpLine says what MCP adds: each MCP contender's median against the
// same run without MCP.
func mcpLine(w io.Writer, cs []*contender) {
	for _, p := range []struct{ with, without string }{{mcpColdName, coldName}, {mcpWarmName, warmName}} {
		a, b := find(cs, p.with), find(cs, p.without)
		if a.err != "" || b.err != "" || len(a.times) == 0 || len(b.times) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %s median, %+.1f ms against %s.", p.with, ms(median(a.times)),
			float64((median(a.times)-median(b.times)).Microseconds())/1000, p.without)
	}
	fmt.Fprintln(w)
}
