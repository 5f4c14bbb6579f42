package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/names"
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
	hosts map[string]bool // name.Registry.RegistryStr() forms: "host" or "host:port"
	own   func(netip.Addr) (bool, error)
}

// NewRegistries lists registry hosts, each checked as it was read
// (ParseRegistry). A host without a port is listed on ports 443 and 80.
// own says whether an address is the host's own (hostaddr.Own; an error
// refuses), which an unlisted host's never is.
func NewRegistries(entries []Registry, own func(netip.Addr) (bool, error)) *Registries {
	if own == nil {
		own = func(netip.Addr) (bool, error) { return false, errors.New("no check of the host's own addresses") }
	}
	r := &Registries{hosts: map[string]bool{}, own: own}
	for _, e := range entries {
		r.hosts[e.key] = true
	}
	return r
}

// Registry is one registry host entry, checked as it is read: "host",
// "host:port" or an IP address with a port ("127.0.0.1:5000",
// "[::1]:5000"); "docker.io" is Docker Hub. policy.registries is read
// into them as the config is decoded.
type Registry struct {
	text string // as written
	key  string // name.Registry.RegistryStr(): what pulls compare
}

// ParseRegistry checks one registry host entry (CheckRegistry).
func ParseRegistry(s string) (Registry, error) {
	if err := CheckRegistry(s); err != nil {
		return Registry{}, err
	}
	reg, _ := name.NewRegistry(s, name.StrictValidation)
	return Registry{text: s, key: reg.RegistryStr()}, nil
}

// String is the entry as written.
func (r Registry) String() string { return r.text }

// UnmarshalText reads an entry by ParseRegistry's rules.
func (r *Registry) UnmarshalText(b []byte) error {
	v, err := ParseRegistry(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// MarshalText writes the entry as it was written.
func (r Registry) MarshalText() ([]byte, error) { return []byte(r.text), nil }

// isHostname reports whether s is dot-separated labels of A-Z a-z 0-9 and
// inner hyphens (checked byte by byte, package names: a regular expression
// would be compiled at every start of the binary, every container's init
// included).
func isHostname(s string) bool {
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' || !names.Only(label, "-") {
			return false
		}
	}
	return true
}

// CheckRegistry checks one registry host entry (ParseRegistry).
func CheckRegistry(entry string) error {
	bad := fmt.Errorf("%q: want a registry host name, host:port or ip:port", entry)
	host, port := entry, ""
	if h, p, err := net.SplitHostPort(entry); err == nil {
		host, port = h, p
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return bad
		}
	}
	if _, err := netip.ParseAddr(host); err != nil && !isHostname(host) {
		return bad
	}
	if _, err := name.NewRegistry(entry, name.StrictValidation); err != nil {
		return fmt.Errorf("%q: %v", entry, err)
	}
	return nil
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
