package config

import (
	"strings"
	"testing"
)

func TestServicesConfig(t *testing.T) {
	c, err := Parse([]byte(`{"network": {"ca_files": ["/etc/agentrun/ca/internal.pem"], "approval_timeout": "2m",
		"services": {"github": {"url": "https://api.github.com",
			"inject": {"Authorization": {"prefix": "Bearer ", "file": "/etc/agentrun/secrets/github"}},
			"rules": [{"methods": ["GET", "HEAD"], "paths": ["/repos/**"]},
			          {"methods": ["POST"], "paths": ["/repos/*/*/issues"], "approve": true}]}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	ps, ok := c.Network.ProxyService("github")
	if !ok || ps.Name != "github" || ps.Authority() != "api.github.com:443" || len(ps.Inject) != 1 || !ps.Rules[1].Approve {
		t.Errorf("ProxyService(github) = %+v, %v", ps, ok)
	}
	if ps, ok := c.Network.ProxyService("gitlab"); ok {
		t.Errorf("ProxyService(gitlab) = %+v; want none", ps)
	}
	unvalidated := Default()
	unvalidated.Network.Services = c.Network.Services
	if ps, ok := unvalidated.Network.ProxyService("github"); ok {
		t.Errorf("ProxyService(github) of a config never validated = %+v; want none", ps)
	}
	if c.Network.ApprovalTimeout.String() != "2m" || Default().Network.ApprovalTimeout.String() != "60s" {
		t.Errorf("approval_timeout = %q", c.Network.ApprovalTimeout)
	}

	rule := `"rules": [{"methods": ["GET"], "paths": ["/**"]}]`
	for _, tc := range []struct{ doc, want string }{
		{`{"network": {"services": {"Bad Name": {"url": "https://a.example", ` + rule + `}}}}`, `network.services["Bad Name"]: a service name`},
		{`{"network": {"services": {"a": {"url": "https://a.example/v1", ` + rule + `}}}}`, `network.services["a"]: service "a": url`},
		{`{"network": {"services": {"a": {"url": "https://a.example"}}}}`, `no rules`},
		{`{"network": {"services": {"a": {"url": "https://a.example", "rules": [{"methods": ["GET"], "paths": ["/a/../b"]}]}}}}`, `dot segments`},
		{`{"network": {"services": {"a": {"url": "https://a.example", "rules": [{"methods": ["get"], "paths": ["/"]}]}}}}`, `upper case`},
		{`{"network": {"services": {"a": {"url": "https://a.example", "inject": {"Authorization": {"file": "secrets/a"}}, ` + rule + `}}}}`, `network.services["a"].inject["Authorization"].file`},
		{`{"network": {"services": {"a": {"url": "https://a.example", "inject": {"Host": {"file": "/s"}}, ` + rule + `}}}}`, `set by the proxy`},
		{`{"network": {"services": {"a": {"url": "https://a.example", ` + rule + `}, "b": {"url": "https://A.example:443/", ` + rule + `}}}}`, `same host and port (a.example:443) as service "a"`},
		{`{"network": {"services": {"a": {"url": "https://a.example", "rulez": []}}}}`, `rulez`},
		{`{"network": {"ca_files": ["ca.pem"]}}`, `network.ca_files[0]`},
		{`{"network": {"approval_timeout": "0s"}}`, `network.approval_timeout`},
		{`{"network": {"approval_timeout": "2h"}}`, `network.approval_timeout`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v; want an error with %q", tc.doc, err, tc.want)
		}
	}
}
