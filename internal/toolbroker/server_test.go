package toolbroker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/test/toolprobe"
)

// The test binary is its own MCP server: run with serverEnv set, TestMain
// serves MCP over stdio instead of running the tests.
const serverEnv = "TOOLBROKER_TEST_SERVER"

func TestMain(m *testing.M) {
	toolprobe.Main() // the hostile server of TestRootFence
	switch os.Getenv(serverEnv) {
	case "":
		code := m.Run()
		if bin, err := serverBinary(); err == nil && os.Geteuid() == 0 {
			os.RemoveAll(filepath.Dir(bin)) // the copy serverBinary made
		}
		if testUIDsDir != "" {
			os.RemoveAll(testUIDsDir)
		}
		os.Exit(code)
	case "stdio":
		err := testServer().Run(context.Background(), &mcp.StdioTransport{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "test server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	case "fail":
		fmt.Fprintln(os.Stderr, "test server: failing at start, secret", os.Getenv("SECRET"))
		os.Exit(3)
	case "mute":
		time.Sleep(time.Hour) // never answers initialize
	case "sleeper":
		time.Sleep(time.Hour)
	}
	os.Exit(2)
}

// textResult is a result of one text content.
func textResult(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

type sizeArgs struct {
	N int `json:"n"`
}

type nameArgs struct {
	Name string `json:"name"`
}

type forkArgs struct {
	Setsid bool `json:"setsid,omitempty"`
}

// testServer is the server both transports serve: its tools echo the
// arguments, say the environment and the user, answer n bytes, hang,
// fork a sleeper, and fail.
func testServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes"}, func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, map[string]any, error) {
		return textResult(string(req.Params.Arguments)), in, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "get_env", Description: "an environment variable"}, func(ctx context.Context, req *mcp.CallToolRequest, in nameArgs) (*mcp.CallToolResult, any, error) {
		return textResult(os.Getenv(in.Name) + "|" + strconv.Itoa(len(os.Environ()))), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "get_ids", Description: "uid and gid"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return textResult(fmt.Sprintf("%d:%d:%d", os.Getuid(), os.Getgid(), os.Getpid())), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "n bytes"}, func(ctx context.Context, req *mcp.CallToolRequest, in sizeArgs) (*mcp.CallToolResult, any, error) {
		return textResult(strings.Repeat("x", in.N)), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "hang", Description: "never answers"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		<-ctx.Done()
		time.Sleep(time.Hour) // nor when cancelled
		return nil, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fork", Description: "starts a sleeper"}, func(ctx context.Context, req *mcp.CallToolRequest, in forkArgs) (*mcp.CallToolResult, any, error) {
		cmd := exec.Command("/proc/self/exe")
		cmd.Env = []string{serverEnv + "=sleeper"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: in.Setsid}
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		return textResult(strconv.Itoa(cmd.Process.Pid)), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "create_issue", Description: "held"}, func(ctx context.Context, req *mcp.CallToolRequest, in map[string]any) (*mcp.CallToolResult, any, error) {
		return textResult("created"), nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "isError"}, func(ctx context.Context, req *mcp.CallToolRequest, in struct{}) (*mcp.CallToolResult, any, error) {
		return nil, nil, fmt.Errorf("the tool failed")
	})
	return s
}
