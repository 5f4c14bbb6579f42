//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/proxy/proxytest"
	"github.com/agentrun/agentrun/test/testenv"
)

// hostListener listens on ip in the host namespace and answers the
// first line of each connection with "hello from the host", handing the
// accepted connections to conns.
func hostListener(t *testing.T, ip netip.Addr, conns chan<- net.Conn) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					fmt.Fprintln(c, "hello from the host")
				}
			}()
			select {
			case conns <- c:
			default:
				c.Close()
			}
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// hostOwnPolicy names the host's own addresses: the host end of the
// Internet's veth (inside an allowed range) and loopback (allowed too).
func hostOwnPolicy(in *proxytest.Internet, veth, loop netip.AddrPort) Policy {
	return Policy{
		Allow: allowOf(fmt.Sprintf("hostself.test:%d", veth.Port()), fmt.Sprintf("loopself.test:%d", loop.Port()), "internet.test"),
		Hosts: map[string]netip.Addr{
			"hostself.test": in.HostIP, "loopself.test": netip.MustParseAddr("127.0.0.1"), "internet.test": in.IP,
		},
		AllowRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("127.0.0.0/8")},
	}
}

// TestProxyHostOwn: a name that maps to an address of the host itself
// is refused even inside an allowed range (the host end of a veth, and
// loopback with 127.0.0.0/8 allowed), as a denial the report records;
// host_ports listing the exact address and port lets it through, and
// the connection reads as a sandbox's to the host's listener (IsEgress)
// while it is open.
func TestProxyHostOwn(t *testing.T) {
	testenv.RequireRoot(t)
	in := proxytest.NewInternet(t)
	testenv.NoLeaks(t)
	accepted := make(chan net.Conn, 4)
	veth := hostListener(t, in.HostIP, accepted)
	loop := hostListener(t, netip.MustParseAddr("127.0.0.1"), accepted)
	self := map[string]netip.AddrPort{"hostself.test": veth, "loopself.test": loop}
	// The proxy reads the host's addresses at most once per Refresh:
	// wait until the new veth's is among them.
	deadline := time.Now().Add(10 * hostaddr.Refresh)
	for own, _ := hostaddr.Own(in.HostIP); !own; own, _ = hostaddr.Own(in.HostIP) {
		if time.Now().After(deadline) {
			t.Fatalf("hostaddr.Own(%s) is not true: the host end of a veth", in.HostIP)
		}
		time.Sleep(hostaddr.Refresh / 10)
	}

	t.Run("refused", func(t *testing.T) {
		r := startRun(t, in, hostOwnPolicy(in, veth, loop))
		for name, ap := range self {
			auth := fmt.Sprintf("%s:%d", name, ap.Port())
			resp, body, _ := r.connect(auth)
			want := fmt.Sprintf("host's own address %s (network.host_ports does not list %s)", ap.Addr(), ap)
			if resp.StatusCode != 403 || !strings.Contains(body, want) {
				t.Errorf("CONNECT %s = %d %q; want 403 %q", auth, resp.StatusCode, body, want)
			}
			r.wantDenied(name, int(ap.Port()), want)
		}
		select {
		case c := <-accepted:
			t.Errorf("the host's listener %s got a connection from the proxy", c.LocalAddr())
			c.Close()
		default:
		}
		// The fake internet beside it is still reached.
		if code, body, _ := get(t, r.explicitClient(), "https://internet.test/hello"); code != 200 {
			t.Errorf("internet.test: %d %q", code, body)
		}
	})

	t.Run("host_ports", func(t *testing.T) {
		pol := hostOwnPolicy(in, veth, loop)
		pol.HostPorts = []netip.AddrPort{veth, loop}
		r := startRun(t, in, pol)
		for name, ap := range self {
			auth := fmt.Sprintf("%s:%d", name, ap.Port())
			resp, _, c := r.connect(auth)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT %s with host_ports %s = %d; want 200", auth, ap, resp.StatusCode)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintln(c, "hello from the sandbox")
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || line != "hello from the host\n" {
				t.Errorf("through CONNECT %s: %q, %v", auth, line, err)
			}
			var up net.Conn
			select {
			case up = <-accepted:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: the host's listener saw no connection", auth)
			}
			client := up.RemoteAddr().(*net.TCPAddr).AddrPort()
			server := up.LocalAddr().(*net.TCPAddr).AddrPort()
			if !IsEgress(client, server) {
				t.Errorf("IsEgress(%s, %s) = false while the tunnel is open", client, server)
			}
			c.Close()
			up.Close()
			deadline := time.Now().Add(10 * time.Second)
			for IsEgress(client, server) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if IsEgress(client, server) {
				t.Errorf("IsEgress(%s, %s) = true after the tunnel closed", client, server)
			}
		}
		// Another port of the same address is still refused.
		other := fmt.Sprintf("hostself.test:%d", loop.Port())
		pol2 := hostOwnPolicy(in, veth, loop)
		pol2.Allow = withAllow(pol2.Allow, other)
		pol2.HostPorts = []netip.AddrPort{veth}
		r2 := startRun(t, in, pol2)
		if resp, body, _ := r2.connect(other); resp.StatusCode != 403 || !strings.Contains(body, "host's own address") {
			t.Errorf("CONNECT %s, host_ports %s only = %d %q; want 403", other, veth, resp.StatusCode, body)
		}
	})
}
