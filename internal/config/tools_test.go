package config

import (
	"strings"
	"testing"
	"time"
)

func TestToolsConfig(t *testing.T) {
	c, err := Parse([]byte(`{"tools": {
		"github": {"command": ["/usr/local/bin/github-mcp-server", "stdio"],
		           "env": {"GITHUB_TOKEN": {"file": "/etc/agentrun/secrets/github"}, "MODE": {"value": "ro"}},
		           "user": "1000:1000", "allow": ["api.github.com", "*.githubusercontent.com:443"],
		           "rules": [{"tools": ["get_*", "list_*"]}, {"tools": ["create_issue"], "approve": true}]},
		"docs": {"url": "https://mcp.example.com/mcp",
		         "headers": {"Authorization": {"prefix": "Bearer ", "file": "/etc/agentrun/secrets/docs"}}}},
		"tool_limits": {"calls": 10, "result_bytes": "2m", "call_timeout": "5s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if g := c.Tools["github"]; len(g.Rules) != 2 || !g.Rules[1].Approve || g.Env["GITHUB_TOKEN"].File == "" || len(g.Allow) != 2 {
		t.Errorf("tools[github] = %+v", g)
	}
	calls, conc, arg, res, timeout := c.ToolLimits.Effective()
	if calls != 10 || conc != DefaultToolConcurrent || arg != DefaultToolArgBytes || res != 2<<20 || timeout != 5*time.Second {
		t.Errorf("Effective = %d %d %d %d %s", calls, conc, arg, res, timeout)
	}
	if _, _, _, _, d := Default().ToolLimits.Effective(); d != time.Minute {
		t.Errorf("default call timeout %s", d)
	}

	rules := `"rules": [{"tools": ["*"]}]`
	for _, tc := range []struct{ doc, want string }{
		{`{"tools": {"Bad": {"command": ["/bin/x"], ` + rules + `}}}`, `tools["Bad"]: a tool server's name`},
		{`{"tools": {"a": {` + rules + `}}}`, `tools["a"]: neither command nor url`},
		{`{"tools": {"a": {"command": ["/bin/x"], "url": "https://a.example", ` + rules + `}}}`, `tools["a"]: both command and url`},
		{`{"tools": {"a": {"command": ["bin/x"], ` + rules + `}}}`, `tools["a"].command[0]: "bin/x" is not a clean absolute path`},
		{`{"tools": {"a": {"command": ["/bin/../x"], ` + rules + `}}}`, `tools["a"].command[0]`},
		{`{"tools": {"a": {"command": ["/bin/x"], "env": {"1X": {"value": "v"}}, ` + rules + `}}}`, `tools["a"].env["1X"]: not an environment variable name`},
		{`{"tools": {"a": {"command": ["/bin/x"], "env": {"X": {"value": "v", "file": "/s"}}, ` + rules + `}}}`, `tools["a"].env["X"]: both value and file`},
		{`{"tools": {"a": {"command": ["/bin/x"], "env": {"X": {"file": "s"}}, ` + rules + `}}}`, `tools["a"].env["X"]: file: "s" is not a clean absolute path`},
		{`{"tools": {"a": {"command": ["/bin/x"], "env": {"X": {"prefix": "p"}}, ` + rules + `}}}`, `prefix without file`},
		{`{"tools": {"a": {"command": ["/bin/x"], "user": "0:0", ` + rules + `}}}`, `tools["a"].user: "0:0"`},
		{`{"tools": {"a": {"command": ["/bin/x"], "user": "1000:0", ` + rules + `}}}`, `never root's 0`},
		{`{"tools": {"a": {"command": ["/bin/x"], "user": "root", ` + rules + `}}}`, `tools["a"].user: "root": a tool server never runs as root`},
		{`{"tools": {"a": {"command": ["/bin/x"], "user": "a b", ` + rules + `}}}`, `tools["a"].user`},
		{`{"tools": {"a": {"command": ["/bin/x"], "headers": {"X": {"file": "/s"}}, ` + rules + `}}}`, `tools["a"].headers: headers are sent to a url`},
		{`{"tools": {"a": {"url": "ftp://a.example", ` + rules + `}}}`, `tools["a"].url: "ftp://a.example" is not an http or https URL`},
		{`{"tools": {"a": {"url": "https://", ` + rules + `}}}`, `tools["a"].url`},
		{`{"tools": {"a": {"url": "https://a.example", "user": "1:1", ` + rules + `}}}`, `env, user, allow and shared are a stdio command's`},
		{`{"tools": {"a": {"url": "https://a.example", "allow": ["a.example"], ` + rules + `}}}`, `env, user, allow and shared are a stdio command's`},
		{`{"tools": {"a": {"command": ["/bin/x"], "allow": ["a.example", "http://b.example/"], ` + rules + `}}}`, `tools["a"].allow[1]: "http://b.example/"`},
		{`{"tools": {"a": {"url": "https://a.example", "headers": {"Host": {"file": "/s"}}, ` + rules + `}}}`, `tools["a"].headers["Host"]: "Host" is set by the proxy`},
		{`{"tools": {"a": {"url": "https://a.example", "headers": {"Mcp-Session-Id": {"file": "/s"}}, ` + rules + `}}}`, `set by the MCP client`},
		{`{"tools": {"a": {"url": "https://a.example", "headers": {"X-Key": {"file": "s"}}, ` + rules + `}}}`, `tools["a"].headers["X-Key"].file`},
		{`{"tools": {"a": {"url": "https://a.example", "rules": [{"tools": ["[a-"]}]}}}`, `tools["a"].rules[0].tools: [0] "[a-" is not a glob`},
		{`{"tools": {"a": {"url": "https://a.example", "rules": [{"tools": []}]}}}`, `tools["a"].rules[0].tools: 0 globs`},
		{`{"tools": {"a": {"url": "https://a.example", "rules": [{"tool": ["x"]}]}}}`, `tool`},
		{`{"tool_limits": {"calls": -1}}`, `tool_limits.calls`},
		{`{"tool_limits": {"concurrent": 1000}}`, `tool_limits.concurrent`},
		{`{"tool_limits": {"argument_bytes": "10"}}`, `tool_limits.argument_bytes`},
		{`{"tool_limits": {"result_bytes": "1g"}}`, `tool_limits.result_bytes`},
		{`{"tool_limits": {"call_timeout": "2h"}}`, `tool_limits.call_timeout`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v; want an error with %q", tc.doc, err, tc.want)
		}
	}
	many := `{"tools": {"a": {"url": "https://a.example", "rules": [` + strings.Repeat(`{"tools": ["x"]},`, MaxRules) + `{"tools": ["x"]}]}}}`
	if _, err := Parse([]byte(many)); err == nil || !strings.Contains(err.Error(), `tools["a"].rules: 65 rules`) {
		t.Errorf("65 rules: %v", err)
	}
}

func TestParseToolUser(t *testing.T) {
	for _, tc := range []struct {
		in   string
		name string
		ids  [2]uint32
		ok   bool
	}{
		{"", "", [2]uint32{65534, 65534}, true},
		{"1000:100", "", [2]uint32{1000, 100}, true},
		{"www-data", "www-data", [2]uint32{}, true},
		{"0:1", "", [2]uint32{}, false},
		{"1:", "", [2]uint32{}, false},
		{"4294967295:1", "", [2]uint32{}, false},
		{"-x", "", [2]uint32{}, false},
		{"root", "", [2]uint32{}, false},
	} {
		name, ids, err := ParseToolUser(tc.in)
		if (err == nil) != tc.ok || err == nil && (name != tc.name || ids != tc.ids) {
			t.Errorf("ParseToolUser(%q) = %q %v %v", tc.in, name, ids, err)
		}
	}
}
