package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/proxy/proxytest"
)

// waitOwn waits until the proxies of this process (which read the host's
// addresses at most once per hostaddr.Refresh) take ip for the host's own.
func waitOwn(t *testing.T, ip netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(10 * hostaddr.Refresh)
	for {
		own, err := hostaddr.Own(ip)
		if own {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hostaddr.Own(%s) = %v, %v; want true: it is the host end of a veth", ip, own, err)
		}
		time.Sleep(hostaddr.Refresh / 10)
	}
}

// hostServer serves "hello from the host" over HTTP on ip in the host
// namespace, counting the requests it gets.
func hostServer(t *testing.T, ip netip.Addr, hits *atomic.Int64) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "hello from the host")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// TestHostOwnAddressRefused: a name of network.hosts that maps to an
// address of the host itself (the host end of the fake internet's veth,
// inside the allowed 198.18.0.0/15, and 127.0.0.1 with 127.0.0.0/8
// allowed) is refused to the program inside the sandbox, through the
// proxy and transparently, and recorded in network.denied as the host's
// own; with network.host_ports listing the exact address and port, the
// same program reaches the host's server.
func TestHostOwnAddressRefused(t *testing.T) {
	eachRuntime(t, func(t *testing.T, rt string) {
		in := proxytest.NewInternet(t)
		var hits atomic.Int64
		self := map[string]netip.AddrPort{
			"hostself.test": hostServer(t, in.HostIP, &hits),
			"loopself.test": hostServer(t, netip.MustParseAddr("127.0.0.1"), &hits),
		}
		waitOwn(t, in.HostIP)
		cfg := netConfigFor(t, in, rt)
		cfg.Network.AllowRanges = append(cfg.Network.AllowRanges, netip.MustParsePrefix("127.0.0.0/8"))
		var code strings.Builder
		code.WriteString(fetchPy)
		var allow []string
		for _, name := range []string{"hostself.test", "loopself.test"} {
			ap := self[name]
			cfg.Network.Hosts[name] = ap.Addr()
			auth := fmt.Sprintf("%s:%d", name, ap.Port())
			allow = append(allow, auth)
			fmt.Fprintf(&code, "print(fetch(%q))\nprint(fetch(%q, proxies=False))\n", "http://"+auth+"/", "http://"+auth+"/")
		}
		code.WriteString(`print(fetch("http://internet.test/hello"))` + "\n")
		allow = append(allow, "internet.test")
		task := netTask(in, code.String(), allow...)

		res := runTaskWith(t, cfg, nil, task)
		lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		if len(lines) != 5 {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
		for i, name := range []string{"hostself.test", "hostself.test", "loopself.test", "loopself.test"} {
			want := fmt.Sprintf("403 agentrun: egress to %s:%d denied: host's own address %s", name, self[name].Port(), self[name].Addr())
			if !strings.HasPrefix(lines[i], want) {
				t.Errorf("line %d = %q; want %q...", i, lines[i], want)
			}
		}
		if lines[4] != "200 hello from internet.test over http" {
			t.Errorf("internet.test beside them: %q", lines[4])
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the host's servers got %d requests from the sandbox", n)
		}
		for name, ap := range self {
			found := false
			for _, d := range res.Network.Denied {
				found = found || d.Host == name && d.Port == int(ap.Port()) && strings.Contains(d.Reason, "host's own address")
			}
			if !found {
				t.Errorf("network.denied lacks %s:%d as the host's own: %+v", name, ap.Port(), res.Network.Denied)
			}
		}

		cfg.Network.HostPorts = []netip.AddrPort{self["hostself.test"], self["loopself.test"]}
		res = runTaskWith(t, cfg, nil, task)
		want := strings.Repeat("200 hello from the host\n", 4) + "200 hello from internet.test over http\n"
		if res.Stdout != want {
			t.Errorf("with host_ports: stdout %q, want %q; stderr %q", res.Stdout, want, res.Stderr)
		}
		if n := hits.Load(); n != 4 {
			t.Errorf("with host_ports the host's servers got %d requests; want 4", n)
		}
	})
}

// guessPy asks serve's /healthz, through the sandbox's proxy, with a
// wrong token 15 times and prints each status.
const guessPy = `
import urllib.request, urllib.error
codes = []
for i in range(15):
    req = urllib.request.Request("http://serve.test:%d/healthz", headers={"Authorization": "Bearer wrong%%d" %% i})
    try:
        codes.append(urllib.request.urlopen(req, timeout=10).status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
    except Exception as e:
        codes.append(type(e).__name__)
print(" ".join(str(c) for c in codes))
`

// TestServeThrottleKeepsSandboxApart: with serve's own address listed
// in network.host_ports, a sandbox that guesses the token through its
// proxy runs out of guesses (429) in a bucket of its own: the operator's
// clients at the same address (127.0.0.1) still have theirs, a wrong
// token getting 401 and the right one 200, not 429.
func TestServeThrottleKeepsSandboxApart(t *testing.T) {
	port := freePort(t)
	// serve.test, the name the sandbox reaches serve by, is one of its
	// names (server.hosts): refused 421 otherwise, before any token.
	cfg := serveConfig(map[string]any{"listen": fmt.Sprintf("tcp://127.0.0.1:%d", port), "token": "s3cret",
		"hosts": []string{"serve.test"}},
		map[string]any{"local_images": []string{*imagesDir}})
	cfg["network"] = map[string]any{"hosts": map[string]string{"serve.test": "127.0.0.1"},
		"host_ports": []string{fmt.Sprintf("127.0.0.1:%d", port)}}
	s := startServeWith(t, cfg)

	b, _ := json.Marshal(map[string]any{"code": fmt.Sprintf(guessPy, port),
		"network": map[string]any{"allow": []string{fmt.Sprintf("serve.test:%d", port)}}, "limits": map[string]any{"timeout": "30s"}})
	var res result.Result
	if resp := s.post(string(b), &res); resp.StatusCode != 200 || res.ExitCode != 0 {
		t.Fatalf("run: status %d, %+v", resp.StatusCode, res)
	}
	codes := strings.Fields(res.Stdout)
	if len(codes) != 15 || codes[0] != "401" || codes[14] != "429" {
		t.Fatalf("the sandbox's wrong tokens got %q; want 401 first and 429 once out of guesses (stderr %q)", res.Stdout, res.Stderr)
	}

	s.token = "wrong"
	var apiErr server.APIError
	if code := s.get("/healthz", &apiErr); code != 401 {
		t.Errorf("the operator's wrong token after the sandbox's guesses: %d %+v; want 401", code, apiErr)
	}
	s.token = "s3cret"
	var h server.Health
	if code := s.get("/healthz", &h); code != 200 {
		t.Errorf("the operator's token after the sandbox's guesses: %d; want 200", code)
	}
	s.stop()
	assertNoLeaks(t)
}
