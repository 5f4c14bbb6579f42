// Package hostaddr tells whether an address is the host's own: one that
// the kernel of agentrun's network namespace delivers to itself, so that a
// connection to it reaches the host's own listeners (serve, a NATS
// server, anything bound to 0.0.0.0).
//
// The host's own addresses are the local routes of that namespace (its
// routing table "local": every address of every interface, loopback, the
// veths' and any local range), and always 127.0.0.0/8, ::1 and the
// unspecified addresses 0.0.0.0 and ::, to which Linux connects as the
// host itself. The routes are read from the kernel when asked and kept
// while the kernel announces no change of a route (a subscription to its
// route notifications, which every added or removed address makes), so
// an address added to an interface is the host's as soon as the kernel
// says so; without the subscription (it failed, or the kernel dropped
// notifications) a read is kept at most a second (Refresh).
package hostaddr

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Refresh is how long a read of the host's local routes is used before
// the next check reads them again when no subscription keeps it current.
const Refresh = time.Second

// maxRoutes bounds the local routes kept from one read.
const maxRoutes = 1 << 16

// always are the host's whatever the routing table says: loopback, and
// the unspecified addresses, which Linux connects to as the host's own.
var always = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("0.0.0.0/32"),
	netip.MustParsePrefix("::/128"),
}

// Set is the host's own addresses, read again when the kernel announces
// a change of its routes, or once Refresh has passed without a
// subscription. Its zero value is ready; Own is safe for concurrent use.
type Set struct {
	mu     sync.Mutex
	read   time.Time
	local  []netip.Prefix
	err    error
	lister func() ([]netip.Prefix, error) // nil: localRoutes
	// watch subscribes to route changes, calling changed on each and
	// ended when the subscription ends; nil: subscribe.
	watch    func(changed, ended func()) error
	refresh  time.Duration // how long a read lasts watched; 0: forever
	watching bool          // a subscription is on
	tried    bool          // a subscription was tried since the last ended
}

// host is the Set of agentrun's own namespace, shared by every check.
var host Set

// Own reports whether ip is one of the host's own addresses (see the
// package doc). When the kernel's routes cannot be read it returns an
// error, which a caller takes for a refusal.
func Own(ip netip.Addr) (bool, error) { return host.Own(ip) }

// Watch starts, if it is not on, the subscription that keeps the host's
// addresses current, as the first check does: it lives as long as the
// process (a netlink socket and two goroutines). A leak check starts it
// before it counts.
func Watch() { host.routes() }

// Own reports whether ip is one of s's addresses.
func (s *Set) Own(ip netip.Addr) (bool, error) {
	ip = ip.Unmap()
	for _, p := range always {
		if p.Contains(ip) {
			return true, nil
		}
	}
	local, err := s.routes()
	if err != nil {
		return false, err
	}
	for _, p := range local {
		if p.Contains(ip) {
			return true, nil
		}
	}
	return false, nil
}

// routes returns the local routes, read again when the last read is older
// than Refresh.
func (s *Set) routes() ([]netip.Prefix, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.tried {
		// Subscribed before the read, so that no change falls between.
		s.tried = true
		watch := s.watch
		if watch == nil {
			watch = subscribe
		}
		if err := watch(s.changed, s.ended); err == nil {
			s.watching = true
		}
		s.read = time.Time{}
	}
	if !s.read.IsZero() {
		age := time.Since(s.read)
		if s.watching && (s.refresh == 0 || age < s.refresh) || !s.watching && age < Refresh {
			return s.local, s.err
		}
	}
	list := s.lister
	if list == nil {
		list = localRoutes
	}
	s.local, s.err = list()
	s.read = time.Now()
	return s.local, s.err
}

// changed marks the last read out of date.
func (s *Set) changed() {
	s.mu.Lock()
	s.read = time.Time{}
	s.mu.Unlock()
}

// ended marks the subscription gone: reads last Refresh, and the next
// check subscribes again.
func (s *Set) ended() {
	s.mu.Lock()
	s.watching, s.tried, s.read = false, false, time.Time{}
	s.mu.Unlock()
}

// subscribe subscribes to the kernel's route notifications of this
// namespace (IPv4 and IPv6; adding or removing an address adds or removes
// its local route), calling changed on each and ended when the
// subscription fails or the kernel drops notifications.
func subscribe(changed, ended func()) error {
	ch := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	var once sync.Once
	stop := func() { once.Do(func() { close(done); ended() }) }
	err := netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{
		// Not under the caller's lock: on a goroutine of its own.
		ErrorCallback: func(error) { go func() { changed(); stop() }() },
	})
	if err != nil {
		return fmt.Errorf("subscribing to route changes: %w", err)
	}
	go func() {
		for range ch {
			changed()
		}
		stop()
	}()
	return nil
}

// localRoutes reads the destinations of the local routing table's local
// routes (RTN_LOCAL), IPv4 and IPv6.
func localRoutes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	var over bool
	filter := &netlink.Route{Table: unix.RT_TABLE_LOCAL}
	err := netlink.RouteListFilteredIter(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE, func(r netlink.Route) bool {
		if r.Type != unix.RTN_LOCAL || r.Dst == nil {
			return true
		}
		if len(out) >= maxRoutes {
			over = true
			return false
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			return true
		}
		bits, _ := r.Dst.Mask.Size()
		if p, err := a.Unmap().Prefix(bits); err == nil {
			out = append(out, p)
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("reading the host's local routes: %w", err)
	}
	if over {
		return nil, errors.New("reading the host's local routes: more than 65536")
	}
	return out, nil
}
