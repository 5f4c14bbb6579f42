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
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("tools/list: %v %+v", err, tools)
	}
	b, _ := json.Marshal(tools.Tools[0].InputSchema)
	var sch struct {
		Properties map[string]struct {
			Enum        []string `json:"enum"`
			Description string   `json:"description"`
			MaxItems    *int     `json:"maxItems"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &sch); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sch.Properties["language"].Enum, ","); got != "bash,python,ruby,sh" {
		t.Errorf("language enum %q; want bash,python,ruby,sh", got)
	}
	if d := sch.Properties["timeout"].Description; !strings.Contains(d, "3s by default, at most 20s") {
		t.Errorf("timeout description %q", d)
	}
	if n := sch.Properties["network_allow"]; n.MaxItems == nil || *n.MaxItems != 0 || !strings.Contains(n.Description, "no network") {
		t.Errorf("network_allow with no network allowed: %+v", n)
	}
	if d := tools.Tools[0].Description; !strings.Contains(d, "There is no network.") || !strings.Contains(d, "ruby") {
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
