package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/netpolicy"
)

// Registries is the policy for pulls of references that a task named: the
// registries they may come from. A reference whose registry is not listed
// is refused before any connection is made. Every connection such a pull
// makes (to the registry, its token service, or wherever it redirects) is
// checked when it is dialled, after name resolution, against the address
// actually dialled: a host that is not listed must be at a globally
// routable address, never at a loopback, private, link-local (cloud
// metadata), CGNAT, unique-local or otherwise reserved one
// (netpolicy.CheckAddr), nor one of the host's own (NewRegistries' own:
// its public address too).
// A listed host may be anywhere: listing it is the operator's say-so.
// Such pulls never use the environment's HTTP proxy, which would dial in
// their place.
type Registries struct {
	hosts map[string]bool // name.Registry.RegistryStr() forms (endpoint.Registry.Key): "host" or "host:port"
	own   func(netip.Addr) (bool, error)
}

// NewRegistries lists registry hosts, each checked as it was read
// (endpoint.ParseRegistry, the config's policy.registries). A host
// without a port is listed on ports 443 and 80.
// own says whether an address is the host's own (hostaddr.Own; an error
// refuses), which an unlisted host's never is.
func NewRegistries(entries []endpoint.Registry, own func(netip.Addr) (bool, error)) *Registries {
	if own == nil {
		own = func(netip.Addr) (bool, error) { return false, errors.New("no check of the host's own addresses") }
	}
	r := &Registries{hosts: map[string]bool{}, own: own}
	for _, e := range entries {
		r.hosts[e.Key()] = true
	}
	return r
}

// lists reports whether the registry of a reference (its RegistryStr) is
// listed.
func (r *Registries) lists(registry string) bool { return r.hosts[registry] }

// listsAddr reports whether a connection to host:port is to a listed
// registry.
func (r *Registries) listsAddr(host, port string) bool {
	if r.hosts[net.JoinHostPort(host, port)] { // "[::1]:5000" for IPv6
		return true
	}
	if port != "443" && port != "80" {
		return false
	}
	// "docker.io" is listed as index.docker.io, which is also the host
	// go-containerregistry dials for it.
	return r.hosts[host]
}

// dialTimeout bounds one connection attempt of a pull.
const dialTimeout = 10 * time.Second

// dialer dials for a pull of a reference on registry: it resolves the
// host itself, checks each address, and dials exactly an address it
// checked, so that neither a DNS answer nor a redirect can lead the pull
// to an address the policy refuses.
func (r *Registries) dialer(registry string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: dialTimeout}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("dialing %s: bad port", addr)
		}
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{ip}
		} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err // a *net.DNSError
		}
		listed := r.listsAddr(host, portStr)
		var errs []error
		for _, ip := range ips {
			if !listed {
				if err := (netpolicy.Dest{Own: r.own}).Check(netip.AddrPortFrom(ip, uint16(port))); err != nil {
					errs = append(errs, fmt.Errorf("dialing %s (%s): %w", addr, ip, &PolicyError{Registry: registry, AtConnect: true}))
					continue
				}
			}
			conn, err := d.DialContext(ctx, network, netip.AddrPortFrom(ip, uint16(port)).String())
			if err == nil {
				return conn, nil
			}
			errs = append(errs, err)
		}
		if len(errs) == 0 {
			return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		}
		// A policy refusal wins: it is what the pull must say.
		for _, err := range errs {
			if errors.Is(err, errkind.ErrPolicy) {
				return nil, err
			}
		}
		return nil, errs[0]
	}
}

// transport is the HTTP transport of one pull: go-containerregistry's
// default, and for a pull under a policy, dialling through its checks and
// never through a proxy.
func (r *Registries) transport(registry string) http.RoundTripper {
	if r == nil {
		return remote.DefaultTransport
	}
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = r.dialer(registry)
	return t
}
