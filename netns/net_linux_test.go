//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/agentrun/agentrun/test/testenv"
)

// nsInode returns the "net:[N]" link text of fd path p.
func nsInode(t *testing.T, p string) string {
	t.Helper()
	s, err := os.Readlink(p)
	if err != nil {
		t.Fatalf("readlink %s: %v", p, err)
	}
	return s
}

// fdsPointingAt counts this process's fds whose link text is target.
func fdsPointingAt(target string) int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if s, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && s == target {
			n++
		}
	}
	return n
}

func TestSetupClose(t *testing.T) {
	testenv.RequireRoot(t)
	subnets, err := NewSubnets(DefaultCIDR)
	if err != nil {
		t.Fatal(err)
	}
	before := testenv.NoLeaks(t)
	hostNS := nsInode(t, "/proc/self/ns/net")

	n, err := subnets.Setup()
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	if !strings.HasPrefix(n.SandboxPath, fmt.Sprintf("/proc/%d/fd/", os.Getpid())) {
		t.Errorf("SandboxPath = %q; want /proc/<pid>/fd/<n>", n.SandboxPath)
	}
	sbxNS := nsInode(t, n.SandboxPath)
	if sbxNS == hostNS || !strings.HasPrefix(sbxNS, "net:[") {
		t.Errorf("SandboxPath points at %q; want a net namespace other than the host's %q", sbxNS, hostNS)
	}

	// Nothing new on the host.
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if name == GatewayIf || (name == SandboxIf && !before.HasLink(l.Attrs().Index, name)) {
			t.Errorf("host namespace has link %q", name)
		}
	}

	// Sandbox side: lo and eth0 up, address, and no default route: only the
	// connected /30 to the gateway.
	err = n.Do(Sandbox, func() error {
		ls, err := netlink.LinkList()
		if err != nil {
			return err
		}
		var names []string
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
			if l.Attrs().Flags&net.FlagUp == 0 {
				return fmt.Errorf("link %s is down", l.Attrs().Name)
			}
		}
		if strings.Join(names, ",") != "lo,eth0" {
			return fmt.Errorf("sandbox links = %v; want [lo eth0]", names)
		}
		eth0, _ := netlink.LinkByName(SandboxIf)
		addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(addrs) != 1 || !addrs[0].IP.Equal(n.Sandbox) {
			return fmt.Errorf("eth0 addresses = %v; want %v/30", addrs, n.Sandbox)
		}
		if v6, _ := netlink.AddrList(eth0, netlink.FAMILY_V6); len(v6) != 0 {
			return fmt.Errorf("eth0 has IPv6 addresses %v; want none", v6)
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() || r.Gw != nil {
				return fmt.Errorf("sandbox has route %v; want only the connected /30", r)
			}
		}
		if len(routes) != 1 || !routes[0].Dst.Contains(n.Gateway) {
			return fmt.Errorf("sandbox routes = %v; want the /30 holding %v", routes, n.Gateway)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = n.Do(Gateway, func() error {
		ls, err := netlink.LinkList()
		if err != nil {
			return err
		}
		var names []string
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
		if strings.Join(names, ",") != "lo,gw0" {
			return fmt.Errorf("gateway links = %v; want [lo gw0]", names)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway's socket buffers and accept queues are bounded; the
	// host's settings are not touched.
	hostRmem, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem")
	err = n.Do(Gateway, func() error {
		for path, want := range map[string]string{
			"/proc/sys/net/ipv4/tcp_rmem":  fmt.Sprintf("4096\t65536\t%d", GatewaySocketBuffer),
			"/proc/sys/net/ipv4/tcp_wmem":  fmt.Sprintf("4096\t16384\t%d", GatewaySocketBuffer),
			"/proc/sys/net/core/somaxconn": fmt.Sprint(GatewayBacklog),
		} {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if got := strings.TrimSpace(string(b)); got != want {
				return fmt.Errorf("gateway %s = %q; want %q", path, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_rmem"); string(b) != string(hostRmem) || strings.Contains(string(b), fmt.Sprint(GatewaySocketBuffer)) {
		t.Errorf("host tcp_rmem = %q; want it untouched", b)
	}

	// Gateway listener reachable from the sandbox.
	l, err := n.Listen("tcp4", net.JoinHostPort(n.Gateway.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, err = c.Write([]byte("hi"))
			c.Close()
		}
		done <- err
	}()
	c, err := n.DialContext(context.Background(), Sandbox, "tcp4", l.Addr().String())
	if err != nil {
		t.Fatalf("dial gateway listener from sandbox: %v", err)
	}
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil || string(buf) != "hi" {
		t.Errorf("read from gateway listener = %q, %v; want \"hi\"", buf, err)
	}
	c.Close()
	if err := <-done; err != nil {
		t.Error(err)
	}
	l.Close()

	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := fdsPointingAt(sbxNS); got != 0 {
		t.Errorf("%d fds still hold the sandbox namespace", got)
	}
	if err := n.Do(Sandbox, func() error { return nil }); err == nil {
		t.Error("Do after Close succeeded; want an error")
	}
	if got := subnets.InUse(); got != 0 {
		t.Errorf("InUse after Close = %d; want 0", got)
	}
}

func TestIsolation(t *testing.T) {
	testenv.RequireRoot(t)
	subnets, _ := NewSubnets(DefaultCIDR)
	n, err := subnets.Setup()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()

	// A host service on 0.0.0.0 is not reachable from the sandbox: neither
	// at the gateway address nor at any host address.
	hostL, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	port := hostL.Addr().(*net.TCPAddr).Port
	if c, err := net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatalf("control: host dial of its own listener: %v", err)
	} else {
		c.Close()
	}
	targets := []string{n.Gateway.String(), "127.0.0.1"}
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			if !a.IP.IsLoopback() {
				targets = append(targets, a.IP.String())
			}
		}
	}
	for _, ip := range targets {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		c, err := n.DialContext(ctx, Sandbox, "tcp4", net.JoinHostPort(ip, fmt.Sprint(port)))
		cancel()
		t.Logf("sandbox dial %s:%d: %v after %v", ip, port, err, time.Since(start).Round(time.Millisecond))
		if err == nil {
			c.Close()
			t.Errorf("sandbox reached host listener at %s:%d", ip, port)
		}
	}
	// Direct egress has no route beyond the gateway.
	for _, addr := range []string{"1.1.1.1:443", "10.0.0.1:80", "169.254.169.254:80"} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		c, err := n.DialContext(ctx, Sandbox, "tcp4", addr)
		cancel()
		t.Logf("sandbox dial %s: %v after %v", addr, err, time.Since(start).Round(time.Millisecond))
		if err == nil {
			c.Close()
			t.Errorf("sandbox connected to %s", addr)
		} else if !errors.Is(err, syscall.ENETUNREACH) {
			t.Errorf("sandbox dial %s: %v; want ENETUNREACH at once", addr, err)
		}
	}
	// Gateway listeners are not reachable from the host namespace.
	l, err := n.Listen("tcp4", net.JoinHostPort(n.Gateway.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := (&net.Dialer{Timeout: 500 * time.Millisecond}).Dial("tcp4", l.Addr().String())
	if err == nil {
		c.Close()
		t.Errorf("host reached gateway listener %s", l.Addr())
	}
}

func TestConcurrentSetups(t *testing.T) {
	testenv.RequireRoot(t)
	subnets, _ := NewSubnets(DefaultCIDR)
	testenv.NoLeaks(t)
	const runs = 20
	nets := make([]*Net, runs)
	errs := make([]error, runs)
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() { nets[i], errs[i] = subnets.Setup() })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, n := range nets {
		if errs[i] != nil {
			t.Errorf("Setup %d: %v", i, errs[i])
			continue
		}
		if seen[n.Gateway.String()] {
			t.Errorf("subnet of %v handed out twice", n.Gateway)
		}
		seen[n.Gateway.String()] = true
	}
	if got := subnets.InUse(); got != runs {
		t.Errorf("InUse = %d; want %d", got, runs)
	}
	for _, n := range nets {
		if n != nil {
			wg.Go(func() {
				if err := n.Close(); err != nil {
					t.Error(err)
				}
			})
		}
	}
	wg.Wait()
	if got := subnets.InUse(); got != 0 {
		t.Errorf("InUse after Close = %d; want 0", got)
	}
}

func TestSetupRollback(t *testing.T) {
	testenv.RequireRoot(t)
	for _, step := range []string{"gateway", "sandbox"} {
		t.Run(step, func(t *testing.T) {
			subnets, _ := NewSubnets(DefaultCIDR)
			testenv.NoLeaks(t)
			injected := errors.New("injected failure")
			setupHook = func(s string) error {
				if s == step {
					return injected
				}
				return nil
			}
			defer func() { setupHook = func(string) error { return nil } }()
			n, err := subnets.Setup()
			if !errors.Is(err, injected) || n != nil {
				t.Fatalf("Setup = %v, %v; want nil, injected failure", n, err)
			}
			if got := subnets.InUse(); got != 0 {
				t.Errorf("InUse after failed Setup = %d; want 0", got)
			}
		})
	}
}

func TestDoRejectsUnknownNamespace(t *testing.T) {
	n := &Net{gw: -1, sbx: -1}
	if err := n.Do(Which(0), func() error { return nil }); err == nil {
		t.Error("Do(Which(0)) succeeded; want an error")
	}
	if err := n.Do(Sandbox, func() error { return nil }); err == nil {
		t.Error("Do on a Net without namespaces succeeded; want an error")
	}
}

func TestDoCarriesPanicAndGoexit(t *testing.T) {
	testenv.RequireRoot(t)
	subnets, _ := NewSubnets(DefaultCIDR)
	n, err := subnets.Setup()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v; want boom", p)
			}
		}()
		n.Do(Sandbox, func() error { panic("boom") })
	}()
	host := nsInode(t, "/proc/self/ns/net") // the main thread's
	for range 50 {
		if err := n.Do(Sandbox, func() error { runtime.Goexit(); return nil }); err == nil {
			t.Fatal("Do with runtime.Goexit returned nil; want an error")
		}
	}
	// The main thread never moved (a locked thread that exits is
	// destroyed, but the main thread would be parked in place).
	if got := nsInode(t, "/proc/self/ns/net"); got != host {
		t.Fatalf("main thread is in namespace %s; it was in %s", got, host)
	}
	// Threads given back to the runtime are in the host namespace.
	for range 50 {
		n.Do(Sandbox, func() error { return nil })
		if got := nsInode(t, fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())); got != host {
			t.Fatalf("thread left in namespace %s; host is %s", got, host)
		}
	}
}

// A lone loopback namespace: its lo is up and reached by DialContext,
// the host's loopback is not, and it has no gateway.
func TestLoopback(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.NoLeaks(t)
	host, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	n, err := Loopback()
	if err != nil {
		t.Fatalf("Loopback: %v", err)
	}
	var inside net.Listener
	if err := n.Do(Sandbox, func() error {
		var err error
		inside, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	ctx := context.Background()
	c, err := n.DialContext(ctx, Sandbox, "tcp4", inside.Addr().String())
	if err != nil {
		t.Fatalf("dialing the namespace's loopback: %v", err)
	}
	c.Close()
	if c, err := n.DialContext(ctx, Sandbox, "tcp4", host.Addr().String()); err == nil {
		c.Close()
		t.Errorf("the host's loopback %s was reached from the namespace", host.Addr())
	}
	if err := n.Do(Gateway, func() error { return nil }); err == nil {
		t.Error("Do(Gateway) worked on a loopback namespace")
	}
	inside.Close()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
}
