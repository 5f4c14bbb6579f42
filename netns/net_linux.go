//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

type nsFD = netns.NsHandle

// setupHook lets tests fail Setup after a named step to check the rollback.
var setupHook = func(step string) error { return nil }

// Setup creates a sandbox and a gateway namespace, a veth between them
// ("gw0" in the gateway, "eth0" in the sandbox) with the addresses of a
// fresh /30, "lo" up in both, and a default route in the sandbox via the
// gateway. On any failure everything done so far is undone.
func (p *Subnets) Setup() (_ *Net, err error) {
	idx, err := p.acquire()
	if err != nil {
		return nil, err
	}
	gwIP, sbxIP := p.addrs(idx)
	n := &Net{subnets: p, idx: idx, gw: -1, sbx: -1, Gateway: gwIP, Sandbox: sbxIP}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()

	if err := createPair(n); err != nil {
		return nil, err
	}
	n.SandboxPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(n.sbx))

	if err := n.configureGateway(); err != nil {
		return nil, err
	}
	if err := setupHook("gateway"); err != nil {
		return nil, err
	}
	if err := n.configureSandbox(); err != nil {
		return nil, err
	}
	if err := setupHook("sandbox"); err != nil {
		return nil, err
	}
	return n, nil
}

// Loopback creates a lone sandbox namespace holding only "lo", up: the
// network of a sandbox with none that this process must still reach
// inside (a live sandbox's ports). It has no gateway: Do and DialContext
// take Sandbox alone, and Listen and ListenPacket fail.
func Loopback() (_ *Net, err error) {
	n := &Net{gw: -1, sbx: -1}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	err = onFreshThread(func() error {
		var err error
		if n.sbx, err = netns.New(); err != nil {
			return fmt.Errorf("creating sandbox namespace: %w", err)
		}
		return writeSysctls(sandboxSysctls)
	})
	if err != nil {
		return nil, err
	}
	n.SandboxPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(n.sbx))
	h, err := n.handle(Sandbox)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := linkUp(h, "lo"); err != nil {
		return nil, fmt.Errorf("sandbox namespace: %w", err)
	}
	return n, nil
}

// createPair makes the two namespaces on a thread of its own and tunes
// their sysctls before any interface exists in them.
func createPair(n *Net) error {
	return onFreshThread(func() error {
		var err error
		if n.gw, err = netns.New(); err != nil {
			return fmt.Errorf("creating gateway namespace: %w", err)
		}
		// The thread is now in the gateway namespace: /proc/sys/net shows its values.
		if err := writeSysctls(gatewaySysctls); err != nil {
			return fmt.Errorf("configuring gateway namespace: %w", err)
		}
		if n.sbx, err = netns.New(); err != nil {
			return fmt.Errorf("creating sandbox namespace: %w", err)
		}
		if err := writeSysctls(sandboxSysctls); err != nil {
			return fmt.Errorf("configuring sandbox namespace: %w", err)
		}
		return nil
	})
}

type sysctl struct {
	path, value string
	optional    bool // absent when the kernel lacks IPv6
}

// The gateway forwards nothing; neither veth end gets IPv6 (no link-local
// fe80:: path around the IPv4-only listeners). "default" applies to
// interfaces created later, so the sandbox's lo keeps ::1. The gateway's
// sockets are agentrun's, charged to no run: each buffers at most
// GatewaySocketBuffer bytes each way, and at most GatewayBacklog
// connections wait to be accepted on each listener.
var (
	gatewaySysctls = []sysctl{
		{"/proc/sys/net/ipv4/ip_forward", "0", false},
		{"/proc/sys/net/ipv6/conf/all/forwarding", "0", true},
		{"/proc/sys/net/ipv6/conf/default/disable_ipv6", "1", true},
		{"/proc/sys/net/ipv4/tcp_rmem", fmt.Sprintf("4096 65536 %d", GatewaySocketBuffer), false},
		{"/proc/sys/net/ipv4/tcp_wmem", fmt.Sprintf("4096 16384 %d", GatewaySocketBuffer), false},
		{"/proc/sys/net/core/somaxconn", fmt.Sprint(GatewayBacklog), false},
	}
	sandboxSysctls = []sysctl{
		{"/proc/sys/net/ipv6/conf/default/disable_ipv6", "1", true},
	}
)

func writeSysctls(list []sysctl) error {
	for _, s := range list {
		err := os.WriteFile(s.path, []byte(s.value), 0)
		if err != nil && !(s.optional && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("writing %s: %w", s.path, err)
		}
	}
	return nil
}

// handle opens a netlink route socket inside namespace w.
func (n *Net) handle(w Which) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := n.Do(w, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket in %v namespace: %w", w, err)
	}
	return h, nil
}

func (n *Net) configureGateway() error {
	h, err := n.handle(Gateway)
	if err != nil {
		return err
	}
	defer h.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: GatewayIf},
		PeerName:      SandboxIf,
		PeerNamespace: netlink.NsFd(int(n.sbx)),
	}
	// Sent on the gateway's own socket: the link is born in the gateway
	// namespace and its peer in the sandbox namespace, never on the host.
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("creating veth %s/%s: %w", GatewayIf, SandboxIf, err)
	}
	if err := upWithAddr(h, GatewayIf, n.Gateway); err != nil {
		return fmt.Errorf("gateway namespace: %w", err)
	}
	if err := linkUp(h, "lo"); err != nil {
		return fmt.Errorf("gateway namespace: %w", err)
	}
	return nil
}

func (n *Net) configureSandbox() error {
	h, err := n.handle(Sandbox)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := linkUp(h, "lo"); err != nil {
		return fmt.Errorf("sandbox namespace: %w", err)
	}
	if err := upWithAddr(h, SandboxIf, n.Sandbox); err != nil {
		return fmt.Errorf("sandbox namespace: %w", err)
	}
	// No default route: the connected /30 reaches the gateway, and every
	// other destination fails at once with ENETUNREACH instead of hanging
	// until a timeout.
	return nil
}

func linkUp(h *netlink.Handle, name string) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

func upWithAddr(h *netlink.Handle, name string, ip net.IP) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding %s: %w", name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(30, 32)}}
	if err := h.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("adding %s to %s: %w", addr.IPNet, name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

// Listen creates a listener inside the gateway namespace (for example
// "tcp4", "10.200.0.1:3128"). The socket stays there; Accept may be called
// from any goroutine.
func (n *Net) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(Gateway, func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s %s in gateway namespace: %w", network, addr, err)
	}
	return l, nil
}

// ListenPacket is Listen for packet sockets ("udp4").
func (n *Net) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.Do(Gateway, func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s %s in gateway namespace: %w", network, addr, err)
	}
	return c, nil
}

// DialContext connects from inside namespace w to addr, which must be an IP
// literal with a port (a name would be resolved on another thread, in the
// host namespace). Meant for tests and probes: the sandbox side's view.
func (n *Net) DialContext(ctx context.Context, w Which, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dialing %s from %v namespace: %w", addr, w, err)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil, fmt.Errorf("dialing %s from %v namespace: host is not an IP literal", addr, w)
	}
	var c net.Conn
	err = n.Do(w, func() error {
		var err error
		// One address, no resolution: the socket is made on this thread.
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Do runs fn on a locked OS thread that is inside namespace w, and waits
// for it. Sockets fn creates belong to w; goroutines fn starts do not run
// inside w.
func (n *Net) Do(w Which, fn func() error) error {
	ns, err := n.ns(w)
	if err != nil {
		return err
	}
	if !ns.IsOpen() {
		return fmt.Errorf("%v namespace is closed", w)
	}
	return onFreshThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("entering %v namespace: %w", w, err)
		}
		return fn()
	})
}

// onFreshThread runs fn on a new goroutine locked to its OS thread and
// restores the thread's original network namespace afterwards. If that
// restore fails, or fn ends its goroutine (runtime.Goexit), the thread is
// never unlocked, so the Go runtime destroys it with the goroutine instead
// of reusing a thread in the wrong namespace. A panic in fn is carried
// back to the caller.
func onFreshThread(fn func() error) error {
	r := <-spawnLocked(fn)
	if r.panic != nil {
		panic(r.panic)
	}
	return r.err
}

type threadResult struct {
	err   error
	panic any
}

func spawnLocked(fn func() error) <-chan threadResult {
	done := make(chan threadResult, 1)
	go func() {
		r := threadResult{err: errors.New("function run in a namespace called runtime.Goexit")}
		defer func() { done <- r }() // also runs on Goexit
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The runtime never destroys the main thread (it parks it
			// for good instead), and /proc/<pid>/ns/net shows its
			// namespace: it must never enter another one. Keep it
			// busy here so the work lands on a different thread.
			r = <-spawnLocked(fn)
			runtime.UnlockOSThread()
			return
		}
		orig, err := netns.Get()
		if err != nil {
			// Nothing switched yet; the thread is clean.
			runtime.UnlockOSThread()
			r = threadResult{err: fmt.Errorf("getting current namespace: %w", err)}
			return
		}
		defer orig.Close()
		func() {
			defer func() {
				if p := recover(); p != nil {
					r = threadResult{panic: p}
				}
			}()
			r = threadResult{err: fn()}
		}()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with this goroutine.
			r.err = errors.Join(r.err, fmt.Errorf("restoring thread namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
	}()
	return done
}

// Close deletes the veth (deleting one end deletes both), closes both
// namespace descriptors (the kernel frees a namespace once nothing else,
// such as a container or a socket, holds it) and frees its subnet. It is
// safe to call more than once; later calls return the first call's error.
func (n *Net) Close() error {
	n.closeOnce.Do(func() {
		// The veth lives only in the two namespaces: once their last
		// descriptors are closed (and the sandbox's processes are gone) the
		// kernel destroys both, veth included, in the background. Deleting
		// the veth first would wait for that teardown here (10-70 ms).
		var errs []error
		for _, fd := range []*nsFD{&n.gw, &n.sbx} {
			if fd.IsOpen() {
				if err := fd.Close(); err != nil {
					errs = append(errs, fmt.Errorf("closing namespace descriptor: %w", err))
				}
				*fd = -1
			}
		}
		if n.subnets != nil {
			n.subnets.release(n.idx)
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
