package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

// connect is a client of s over in-memory transports.
func connect(t *testing.T, s *Server) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	if _, err := s.MCP().Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// argSchema is what the tests read of run_code's input schema.
type argSchema struct {
	Properties map[string]struct {
		Enum  []string `json:"enum"`
		Items struct {
			Enum []string `json:"enum"`
		} `json:"items"`
		Description string `json:"description"`
		MaxItems    *int   `json:"maxItems"`
	} `json:"properties"`
}

// runCodeSchema is run_code's input schema and description, as a client
// lists them.
func runCodeSchema(t *testing.T, cs *mcp.ClientSession) (argSchema, string) {
	t.Helper()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("tools/list: %v %+v", err, tools)
	}
	b, _ := json.Marshal(tools.Tools[0].InputSchema)
	var sch argSchema
	if err := json.Unmarshal(b, &sch); err != nil {
		t.Fatal(err)
	}
	return sch, tools.Tools[0].Description
}

// TestSchemaFollowsConfig: the tool's schema names the config's languages
// and policy, so that the model sees what it may ask.
func TestSchemaFollowsConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"languages": {"ruby": ["ruby", "{file}"], "node": null, "python3": null},
		"policy": {"timeout": "20s", "allow_network": false}, "limits": {"timeout": "3s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg, func(context.Context, []byte) (*result.Result, error) {
		t.Error("listing tools ran something")
		return nil, nil
	}, t.Logf)
	cs := connect(t, s)
	defer cs.Close()
	sch, desc := runCodeSchema(t, cs)
	if got := strings.Join(sch.Properties["language"].Enum, ","); got != "bash,python,ruby,sh" {
		t.Errorf("language enum %q; want bash,python,ruby,sh", got)
	}
	if d := sch.Properties["timeout"].Description; !strings.Contains(d, "3s by default, at most 20s") {
		t.Errorf("timeout description %q", d)
	}
	if n, ok := sch.Properties["network_allow"]; ok {
		t.Errorf("network_allow shown with no network allowed: %+v", n)
	}
	if d := desc; !strings.Contains(d, "There is no network.") || !strings.Contains(d, "ruby") {
		t.Errorf("description %q", d)
	}
}

// TestExamples: the ready-made client configs are valid JSON and start
// agentrun mcp.
func TestExamples(t *testing.T) {
	paths, _ := filepath.Glob("../../examples/mcp/*.json")
	if len(paths) != 3 {
		t.Fatalf("examples: %v", paths)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Servers map[string]struct {
				Command string   `json:"command"`
				Args    []string `json:"args"`
			} `json:"mcpServers"`
		}
		if err := json.Unmarshal(b, &cfg); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		a := cfg.Servers["agentrun"]
		if filepath.Base(a.Command) != "agentrun" || len(a.Args) != 1 || a.Args[0] != "mcp" {
			t.Errorf("%s: agentrun is %+v; want agentrun mcp", p, a)
		}
	}
}

// TestDeleteKillsRuns: a client that ends its HTTP session with a call
// going on (a forwarding agentrun mcp whose own client left) gets the run
// killed at once, with no notifications/cancelled sent: the SDK would
// otherwise close the session only after the run ended by itself.
func TestDeleteKillsRuns(t *testing.T) {
	started, killed := make(chan struct{}), make(chan struct{})
	s := New(config.Default(), func(ctx context.Context, _ []byte) (*result.Result, error) {
		close(started)
		select {
		case <-ctx.Done():
			close(killed)
		case <-time.After(time.Minute):
		}
		return &result.Result{}, nil
	}, t.Logf)
	hs := httptest.NewServer(s.HTTPHandler())
	defer hs.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).
		Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolName, Arguments: map[string]any{"code": "x"}})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the run")
	}
	req, _ := http.NewRequest(http.MethodDelete, hs.URL, nil)
	req.Header.Set("Mcp-Session-Id", cs.ID())
	go http.DefaultClient.Do(req)
	select {
	case <-killed:
	case <-time.After(10 * time.Second):
		t.Fatal("DELETE of the session did not kill its run")
	}
}

// toolsConfig is a config with two tool servers.
const toolsConfig = `{"tools": {
	"github": {"command": ["/usr/local/bin/github-mcp-server", "stdio"], "rules": [{"tools": ["get_*"]}]},
	"docs": {"url": "https://mcp.example.com/mcp", "rules": [{"tools": ["*"]}]}}}`

// toolsSchema is the tools argument's schema, and run_code's description.
func toolsSchema(t *testing.T, cs *mcp.ClientSession) (enum []string, maxItems *int, desc, toolDesc string) {
	t.Helper()
	sch, toolDesc := runCodeSchema(t, cs)
	p, ok := sch.Properties["tools"]
	if !ok {
		t.Fatalf("run_code's schema has no tools: %+v", sch)
	}
	return p.Items.Enum, p.MaxItems, p.Description, toolDesc
}

// TestToolsArgument: run_code's tools lists the config's tool servers and
// becomes the task's tools; the tool's description speaks of tools only
// when the config has some.
func TestToolsArgument(t *testing.T) {
	cfg, err := config.Parse([]byte(toolsConfig))
	if err != nil {
		t.Fatal(err)
	}
	tasks := make(chan []byte, 1)
	s := New(cfg, func(_ context.Context, b []byte) (*result.Result, error) {
		tasks <- b
		return &result.Result{ID: "ar-0123456789abcdef0123456789abcdef"}, nil
	}, t.Logf)
	cs := connect(t, s)
	defer cs.Close()
	enum, maxItems, desc, toolDesc := toolsSchema(t, cs)
	if strings.Join(enum, ",") != "docs,github" || maxItems == nil || *maxItems != 2 {
		t.Errorf("tools enum %q, maxItems %v; want docs,github and 2", enum, maxItems)
	}
	for _, want := range []string{"http://tools.agentrun", "agentrun_tools", "/v1/call"} {
		if !strings.Contains(desc, want) || !strings.Contains(toolDesc, want) {
			t.Errorf("tools' or run_code's description lacks %q:\n%s\n%s", want, desc, toolDesc)
		}
	}

	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolName,
		Arguments: map[string]any{"code": "print(1)", "tools": []string{"github"}}})
	if err != nil || res.IsError {
		t.Fatalf("run_code: %v %+v", err, res)
	}
	b := <-tasks
	plan, err := task.Load(b, cfg)
	if err != nil {
		t.Fatalf("the task of run_code with tools (%s): %v", b, err)
	}
	if strings.Join(plan.Tools, ",") != "github" {
		t.Errorf("the task's tools %q (%s); want github", plan.Tools, b)
	}

	// No tools configured: no tools argument, and nothing said of them.
	s = New(config.Default(), func(context.Context, []byte) (*result.Result, error) { return nil, nil }, t.Logf)
	cs2 := connect(t, s)
	defer cs2.Close()
	sch, toolDesc := runCodeSchema(t, cs2)
	if p, ok := sch.Properties["tools"]; ok {
		t.Errorf("tools shown with none configured: %+v", p)
	}
	if strings.Contains(toolDesc, "tools.agentrun") || strings.Contains(toolDesc, "agentrun_tools") {
		t.Errorf("run_code's description speaks of tools with none configured: %s", toolDesc)
	}
}

// TestReloadDescribesTheNewConfig: after Reload (serve's SIGHUP), a
// client that lists the tools again sees the new config's tool servers
// and languages, a call naming a tool server the reload added is taken
// (the schema of before refused it), and whether a kept session's run
// keeps its state follows the new default language.
func TestReloadDescribesTheNewConfig(t *testing.T) {
	var tasks []map[string]any
	s := New(config.Default(), func(_ context.Context, b []byte) (*result.Result, error) {
		var m map[string]any
		json.Unmarshal(b, &m)
		tasks = append(tasks, m)
		return &result.Result{}, nil
	}, t.Logf)
	cs := connect(t, s)
	defer cs.Close()
	call := func() *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolName,
			Arguments: map[string]any{"code": "print(1)", "tools": []string{"ev"}, "session": "ss-0123456789abcdef0123456789abcdef"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := call(); !res.IsError || len(tasks) != 0 {
		t.Fatalf("tools [ev] before the reload: %+v, tasks %v; want refused by the schema", res, tasks)
	}

	next, err := config.Parse([]byte(`{"tools": {"ev": {"url": "http://127.0.0.1:1/mcp", "rules": [{"tools": ["*"]}]}},
		"languages": {"ruby": ["ruby", "{file}"]}, "language": "ruby"}`))
	if err != nil {
		t.Fatal(err)
	}
	s.Reload(next)
	sch, desc := runCodeSchema(t, cs)
	if got := sch.Properties["tools"].Items.Enum; len(got) != 1 || got[0] != "ev" {
		t.Errorf("tools enum after the reload %v; want [ev]", got)
	}
	if !strings.Contains(strings.Join(sch.Properties["language"].Enum, ","), "ruby") || !strings.Contains(desc, "default ruby") {
		t.Errorf("language enum %v, description %q; want ruby, the default", sch.Properties["language"].Enum, desc)
	}
	if res := call(); res.IsError || len(tasks) != 1 {
		t.Fatalf("tools [ev] after the reload: %+v; want run", res)
	}
	if tools, _ := tasks[0]["tools"].([]any); len(tools) != 1 || tools[0] != "ev" || tasks[0]["keep_state"] != nil {
		t.Errorf("task %v; want tools [ev] and no keep_state (ruby, the new default, keeps none)", tasks[0])
	}
}
