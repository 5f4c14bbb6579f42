package mcpserver

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
)

// servicesConfig has one service, and network allowed.
const servicesConfig = `{"network": {"services": {"api": {"url": "https://api.example.com",
	"rules": [{"methods": ["GET"], "paths": ["/**"]}]}}}}`

// TestSchemaLeavesOutWhatTheHostLacks: run_code's schema shows tools,
// network_services and network_allow only where the host offers them (a
// tool server, a service, a policy that allows network): a parameter the
// model could only be refused for is not shown (never as maxItems 0),
// and a call that names one anyway is refused before anything runs.
func TestSchemaLeavesOutWhatTheHostLacks(t *testing.T) {
	for _, c := range []struct {
		name, config string
		shown        []string
		hidden       []string
	}{
		{"default", `{}`, []string{"network_allow"}, []string{"tools", "network_services"}},
		{"no network", `{"policy": {"allow_network": false}}`, nil, []string{"tools", "network_services", "network_allow"}},
		{"services", servicesConfig, []string{"network_allow", "network_services"}, []string{"tools"}},
		{"tools", toolsConfig, []string{"network_allow", "tools"}, []string{"network_services"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(c.config))
			if err != nil {
				t.Fatal(err)
			}
			ran := 0
			s := New(cfg, func(context.Context, []byte) (*result.Result, error) {
				ran++
				return &result.Result{}, nil
			}, t.Logf)
			cs := connect(t, s)
			defer cs.Close()
			sch, _ := runCodeSchema(t, cs)
			for _, p := range c.shown {
				if a, ok := sch.Properties[p]; !ok || a.MaxItems == nil || *a.MaxItems == 0 {
					t.Errorf("%s: %+v (shown %v); want offered", p, a, ok)
				}
			}
			for _, p := range c.hidden {
				if a, ok := sch.Properties[p]; ok {
					t.Errorf("%s shown: %+v; want left out", p, a)
				}
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolName,
					Arguments: map[string]any{"code": "print(1)", p: []string{}}})
				if err != nil || !res.IsError {
					t.Errorf("run_code with %s: %v %+v; want refused", p, err, res)
				}
			}
			if ran != 0 {
				t.Errorf("%d runs; want none", ran)
			}
		})
	}
	cfg, _ := config.Parse([]byte(servicesConfig))
	s := New(cfg, func(context.Context, []byte) (*result.Result, error) { return &result.Result{}, nil }, t.Logf)
	cs := connect(t, s)
	defer cs.Close()
	sch, _ := runCodeSchema(t, cs)
	if got := strings.Join(sch.Properties["network_services"].Items.Enum, ","); got != "api" {
		t.Errorf("network_services enum %q; want api", got)
	}
}

// TestDescriptionTellsValuesAndFigures: run_code's description tells the
// model that a Python run's final expression and its plt.show() figures
// come back (it need not print them), where the host runs Python.
func TestDescriptionTellsValuesAndFigures(t *testing.T) {
	s := New(config.Default(), func(context.Context, []byte) (*result.Result, error) { return nil, nil }, t.Logf)
	cs := connect(t, s)
	defer cs.Close()
	_, desc := runCodeSchema(t, cs)
	for _, want := range []string{"final expression", "plt.show()", "as images", "display(obj)"} {
		if !strings.Contains(desc, want) {
			t.Errorf("description lacks %q:\n%s", want, desc)
		}
	}
	cfg, err := config.Parse([]byte(`{"languages": {"python": null, "python3": null}, "language": "sh"}`))
	if err != nil {
		t.Fatal(err)
	}
	s = New(cfg, func(context.Context, []byte) (*result.Result, error) { return nil, nil }, t.Logf)
	cs2 := connect(t, s)
	defer cs2.Close()
	if _, desc := runCodeSchema(t, cs2); strings.Contains(desc, "plt.show()") {
		t.Errorf("description speaks of Python's values with no Python: %s", desc)
	}
}

// TestValueSentOnce: a value or display bundle with text/html beside its
// text/plain (a pandas frame) reaches the model once, as text/plain,
// with the other types named; images come as images; structuredContent
// keeps every type.
func TestValueSentOnce(t *testing.T) {
	plain, html := strings.Repeat("   a  b\n0  1  2\n", 500), "<table>"+strings.Repeat("<tr><td>1</td><td>2</td></tr>", 500)+"</table>"
	res := &result.Result{ID: "ar-1", Value: result.Bundle{"text/plain": plain, "text/html": html},
		Display: []result.Bundle{{"text/plain": "<Figure 1>", "image/png": "iVBORw0KGgo="},
			{"text/html": "<b>only html</b>"}}}
	ans, out := answer(res)
	var texts []string
	images := 0
	for _, c := range ans.Content[1:] {
		switch c := c.(type) {
		case *mcp.TextContent:
			texts = append(texts, c.Text)
		case *mcp.ImageContent:
			images++
		}
	}
	all := strings.Join(texts, "\n")
	if n := strings.Count(all, plain); n != 1 {
		t.Errorf("the value's text/plain sent %d times; want once", n)
	}
	if strings.Contains(all, "<table>") {
		t.Errorf("the value's text/html sent beside its text/plain")
	}
	for _, want := range []string{"value (text/plain; also text/html in structuredContent):\n   a  b",
		"display 1 (text/plain):\n<Figure 1>", "display 2 (text/html):\n<b>only html</b>"} {
		if !strings.Contains(all, want) {
			t.Errorf("texts lack %q:\n%.300s", want, all)
		}
	}
	if images != 1 || len(texts) != 3 {
		t.Errorf("%d images, %d texts; want 1 and 3", images, len(texts))
	}
	if out.Value["text/html"] != html || out.Value["text/plain"] != plain {
		t.Errorf("structuredContent's value lost a type")
	}
}
