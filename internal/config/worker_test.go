package config

import (
	"strings"
	"testing"
)

func TestWorkerSection(t *testing.T) {
	c, err := Parse([]byte(`{"worker": {"nats": ["tls://a:4222", "nats://b:4222"], "slots": 2, "replicas": 3,
		"tls": {"ca": "/etc/ca.pem", "cert": "/etc/c.pem", "key": "/etc/k.pem"}, "events": ""}}`))
	if err != nil {
		t.Fatal(err)
	}
	w := c.Worker
	if len(w.NATS) != 2 || w.Slots != 2 || w.Replicas != 3 || w.Events != "" || w.Stream != "AGENTRUN" ||
		w.Subject != "agentrun.tasks" || w.Results != "agentrun-results" || w.MaxDeliver != 3 || w.AckWait.String() != "30s" {
		t.Errorf("worker section: %+v", w)
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"worker": {"nats": []}}`, "worker.nats: at least one"},
		{`{"worker": {"nats": ["http://x:1"]}}`, `worker.nats[0]: "http://x:1" is not a nats:// or tls:// URL`},
		{`{"worker": {"creds": "rel/creds"}}`, "worker.creds:"},
		{`{"worker": {"tls": {"cert": "/c.pem"}}}`, "worker.tls: cert and key go together"},
		{`{"worker": {"stream": "a.b"}}`, "worker.stream:"},
		{`{"worker": {"results": ""}}`, "worker.results:"},
		{`{"worker": {"subject": "agentrun.>"}}`, "worker.subject:"},
		{`{"worker": {"events": "a..b"}}`, "worker.events:"},
		{`{"worker": {"slots": -1}}`, "worker.slots:"},
		{`{"worker": {"max_deliver": 0}}`, "worker.max_deliver:"},
		{`{"worker": {"replicas": 6}}`, "worker.replicas:"},
		{`{"worker": {"ack_wait": "100ms"}}`, "worker.ack_wait: 100ms: must be at least 1s"},
		{`{"worker": {"retry_delay": "soon"}}`, "worker.retry_delay:"},
		{`{"worker": {"result_ttl": "0s"}}`, "worker.result_ttl:"},
		{`{"worker": {"bogus": 1}}`, "bogus"},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}

// TestApprovalsWebhook: serve's and a worker's webhook need an http(s)
// URL and a clean absolute secret file together.
func TestApprovalsWebhook(t *testing.T) {
	c, err := Parse([]byte(`{"server": {"approvals": {"webhook": "http://127.0.0.1:9/h", "webhook_secret_file": "/etc/agentrun/secrets/hook", "page": true}},
		"worker": {"approvals": {"webhook": "https://hooks.internal/a", "webhook_secret_file": "/etc/hook"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Server.Approvals.Page || c.Worker.Approvals.Subject != "agentrun.approvals" || c.Worker.Approvals.Webhook != "https://hooks.internal/a" {
		t.Errorf("approvals: %+v, %+v", c.Server.Approvals, c.Worker.Approvals)
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"server": {"approvals": {"webhook": "ftp://x/h", "webhook_secret_file": "/s"}}}`, "server.approvals.webhook:"},
		{`{"server": {"approvals": {"webhook": "https://x/h"}}}`, "server.approvals.webhook_secret_file:"},
		{`{"server": {"approvals": {"webhook_secret_file": "/s"}}}`, "server.approvals.webhook_secret_file: set without webhook"},
		{`{"worker": {"approvals": {"webhook": "https://x/h", "webhook_secret_file": "s"}}}`, "worker.approvals.webhook_secret_file:"},
		{`{"worker": {"approvals": {"subject": "a.*"}}}`, "worker.approvals.subject:"},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}

// TestServerHosts: server.hosts are host names or IP addresses alone,
// each refused naming its index when it is anything else.
func TestServerHosts(t *testing.T) {
	c, err := Parse([]byte(`{"server": {"hosts": ["agentrun.example.com", "Runner-1", "192.0.2.7", "2001:db8::1"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Server.Hosts, " "); got != "agentrun.example.com Runner-1 192.0.2.7 2001:db8::1" {
		t.Errorf("server.hosts: %s", got)
	}
	many := `"h"` + strings.Repeat(`, "h"`, MaxServerHosts)
	for _, tc := range []struct{ doc, want string }{
		{`{"server": {"hosts": ["a.example:8443"]}}`, `server.hosts[0]: want a host name or an IP address, without scheme, port or wildcard`},
		{`{"server": {"hosts": ["ok.example", "https://a.example"]}}`, `server.hosts[1]: want a host name`},
		{`{"server": {"hosts": ["*.example.com"]}}`, `server.hosts[0]: want a host name`},
		{`{"server": {"hosts": [""]}}`, `server.hosts[0]: want a host name`},
		{`{"server": {"hosts": ["a.example."]}}`, `server.hosts[0]: want a host name`},
		{`{"server": {"hosts": ["[::1]"]}}`, `server.hosts[0]: want a host name`},
		{`{"server": {"hosts": ["fe80::1%eth0"]}}`, `server.hosts[0]: "fe80::1%eth0": an IP address with a zone`},
		{`{"server": {"hosts": "a.example"}}`, `server.hosts`},
		{`{"server": {"hosts": [` + many + `]}}`, `server.hosts: 65 names, more than the maximum 64`},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.60s: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}
