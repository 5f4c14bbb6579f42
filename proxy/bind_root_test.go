//go:build linux

package proxy

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// TestProxyOpenDeniesUntilBound: a proxy opened ahead of its run reaches
// nothing from the sandbox until Bind (DNS REFUSED, 403 on :3128, no
// transparent listener) and records none of it; Bind gives it its policy
// once, and a second Bind, with a wider policy, fails and changes nothing.
func TestProxyOpenDeniesUntilBound(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	testenv.NoLeaks(t)
	r := openRun(t, in)

	for _, network := range []string{"udp4", "tcp4"} {
		m, err := r.lookup(network, "internet.test", dns.TypeA)
		if err != nil {
			t.Fatalf("unbound lookup over %s: %v", network, err)
		}
		if m.Rcode != dns.RcodeRefused || len(m.Answer) != 0 {
			t.Errorf("unbound lookup over %s: rcode %s, %d answers; want REFUSED, none", network, dns.RcodeToString[m.Rcode], len(m.Answer))
		}
	}
	if code, body, _ := get(t, r.explicitClient(), "http://internet.test/hello"); code != http.StatusForbidden || !strings.Contains(body, reasonUnbound) {
		t.Errorf("unbound GET through :3128 = %d %q; want 403 %q", code, body, reasonUnbound)
	}
	if resp, body, _ := r.connect("internet.test:443"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("unbound CONNECT = %d %q; want 403", resp.StatusCode, body)
	}
	for _, port := range []string{"80", "443"} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := r.dial(ctx, "tcp4", net.JoinHostPort(r.gw, port))
		cancel()
		if err == nil {
			c.Close()
			t.Errorf("unbound proxy listens on :%s", port)
		}
	}
	if rep := r.px.Report(); len(rep.Allowed)+len(rep.Denied)+len(rep.Failed) != 0 {
		t.Errorf("unbound proxy recorded %+v; want nothing: it is no run's yet", rep)
	}

	pol := policyFor(in)
	pol.Allow = allowOf("internet.test")
	if err := r.px.Bind(pol); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	wider := policyFor(in)
	wider.Allow = allowOf("internet.test", "www.internet.test")
	if err := r.px.Bind(wider); err == nil || !strings.Contains(err.Error(), "bound already") {
		t.Errorf("second Bind = %v; want an error saying a policy is bound", err)
	}

	if code, body, _ := get(t, r.explicitClient(), "http://internet.test/hello"); code != http.StatusOK || body != "hello from internet.test over http" {
		t.Errorf("bound GET = %d %q", code, body)
	}
	if code, body, _ := get(t, r.transparentClient(), "https://internet.test/hello"); code != http.StatusOK || body != "hello from internet.test over https" {
		t.Errorf("bound transparent GET = %d %q", code, body)
	}
	if code, body, _ := get(t, r.explicitClient(), "http://www.internet.test/hello"); code != http.StatusForbidden || !strings.Contains(body, reasonNotAllowed) {
		t.Errorf("GET of a host only the second Bind allowed = %d %q; want 403 %q", code, body, reasonNotAllowed)
	}
	if m, err := r.lookup("udp4", "www.internet.test", dns.TypeA); err != nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("lookup of a host only the second Bind allowed: %v %v; want NXDOMAIN", m, err)
	}
	rep := r.px.Report()
	if len(rep.Allowed) != 2 || rep.Allowed[0].Host != "internet.test" {
		t.Errorf("allowed %+v; want internet.test:80 and :443 only", rep.Allowed)
	}
	r.wantDenied("www.internet.test", 80, reasonNotAllowed)
	r.wantDenied("www.internet.test", DNSPort, reasonDNS)
	if len(rep.Denied) != 2 {
		t.Errorf("denied %+v; want the two denials after Bind only", rep.Denied)
	}

	if err := r.px.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.px.Bind(pol); err == nil {
		t.Error("Bind after Close succeeded")
	}
}

// TestProxyBindFailureLeavesItUnbound: a policy Bind refuses leaves the
// proxy denying, and it cannot be bound after.
func TestProxyBindFailureLeavesItUnbound(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	testenv.NoLeaks(t)
	r := openRun(t, in)
	if err := r.px.Bind(Policy{MaxConns: -1}); err == nil {
		t.Fatal("Bind of a negative limit succeeded")
	}
	if err := r.px.Bind(policyFor(in)); err == nil {
		t.Error("Bind after a failed Bind succeeded")
	}
	if code, _, _ := get(t, r.explicitClient(), "http://internet.test/hello"); code != http.StatusForbidden {
		t.Errorf("GET after a failed Bind = %d; want 403", code)
	}
}

// openRun is startRun for a proxy opened without a policy (Open).
func openRun(t *testing.T, in *proxytest.Internet) *run {
	t.Helper()
	n, err := subnets.Setup()
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	px, err := Open(n)
	if err != nil {
		n.Close()
		t.Fatalf("Open: %v", err)
	}
	r := &run{t: t, n: n, px: px, gw: n.Gateway.String(), in: in}
	t.Cleanup(r.close)
	return r
}
