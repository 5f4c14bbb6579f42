//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// The run's tool broker answers as http://tools.agentrun by every path
// (explicit proxy in absolute form and after CONNECT, transparent by DNS
// and Host), with an allowlist that opens nothing else, and nothing of it
// is in the network report; a run without a broker does not know the name.
func TestToolsHost(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	tools := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprintf(w, `{"method":%q,"path":%q,"body":%q}`, r.Method, r.URL.Path, body)
	})
	r := startRun(t, in, Policy{Tools: tools})
	want := func(how string, status int, body string) {
		t.Helper()
		if status != http.StatusTeapot || !strings.Contains(body, `"path":"/v1/tools"`) {
			t.Errorf("%s: got %d %q, want the broker's 418 for /v1/tools", how, status, body)
		}
	}
	status, body, _ := get(t, r.explicitClient(), "http://tools.agentrun/v1/tools")
	want("explicit proxy", status, body)
	status, body, _ = get(t, r.transparentClient(), "http://TOOLS.agentrun./v1/tools")
	want("transparent", status, body)

	resp, _, c := r.connect("tools.agentrun:80")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT tools.agentrun:80: %s", resp.Status)
	}
	fmt.Fprintf(c, "POST /v1/tools HTTP/1.1\r\nHost: tools.agentrun\r\nContent-Length: 2\r\n\r\n{}")
	got, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("after CONNECT: %v", err)
	}
	b, _ := io.ReadAll(got.Body)
	c.Close()
	want("after CONNECT", got.StatusCode, string(b))
	if !strings.Contains(string(b), `"body":"{}"`) {
		t.Errorf("after CONNECT: the body did not reach the broker: %s", b)
	}

	// Nothing else is open: not the internet host, not another port.
	if status, _, _ := get(t, r.explicitClient(), "http://internet.test/"); status != http.StatusForbidden {
		t.Errorf("internet.test with only tools: got %d, want 403", status)
	}
	if m, err := r.lookup("udp4", "tools.agentrun", dns.TypeAAAA); err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Errorf("AAAA tools.agentrun: %v %v, want an empty answer", m, err)
	}
	rep := r.px.Report()
	for _, a := range rep.Allowed {
		if a.Host == ToolsHost {
			t.Errorf("the report lists the broker's traffic: %+v", a)
		}
	}

	plain := startRun(t, in, Policy{Allow: allowOf("internet.test")})
	if m, err := plain.lookup("udp4", "tools.agentrun", dns.TypeA); err != nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("tools.agentrun without a broker: %v %v, want NXDOMAIN", m, err)
	}
}
