package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/agentrun/agentrun/internal/config"
)

// The names the server answers to (DNS rebinding). A page of another
// site can have its own name resolve to this host, or to a reverse proxy
// in front of serve: the operator's browser then sends that page's
// requests here, with the foreign name in Host, and lets the page read
// the answers as its own origin's; with no server.token such a request
// would run a task. So every request, on every path, is refused unless
// its Host names this server (421), and a request with an Origin header
// is refused unless the origin's host does too (403, whatever the
// method: a foreign page may not read a GET either). The names of this
// server (knownHost): localhost and the loopback addresses, with any
// port; the listen address's host, and the address the request came to;
// "agentrun" on the unix socket (what the clients send there); and the
// names of server.hosts.

// refuseForeignHost answers a request whose Host or Origin does not name
// this server; true when it did.
func (s *Server) refuseForeignHost(w http.ResponseWriter, r *http.Request) bool {
	sc := &s.cfg.Load().Server
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if _, _, ok := previewHost(r.Host, sc.PreviewDomain); ok || s.namesRoute(r) != nil {
		// A sandbox's port by its name: an Origin may be that name
		// alone (the sandbox's own pages), and such an Origin is no
		// other name's, serve's API included.
		for _, o := range r.Header.Values("Origin") {
			if !strings.EqualFold(strings.TrimSuffix(originHost(o), "."), strings.TrimSuffix(hostName(r.Host), ".")) {
				writeError(w, http.StatusForbidden, "", fmt.Sprintf("Origin %s is not this sandbox port's", quoteShort(o)))
				return true
			}
		}
		return false
	}
	if !knownHost(hostName(r.Host), local, sc) {
		writeError(w, http.StatusMisdirectedRequest, "", fmt.Sprintf(
			"Host %s is not a name of this server: it answers to localhost, loopback addresses, its listen address%s and the names of server.hosts",
			quoteShort(r.Host), unixName(local)))
		return true
	}
	for _, o := range r.Header.Values("Origin") {
		if !knownHost(originHost(o), local, sc) {
			writeError(w, http.StatusForbidden, "", fmt.Sprintf(
				"Origin %s is not this server's: a page of another origin may not use the API (add its host to server.hosts if it is this server)",
				quoteShort(o)))
			return true
		}
	}
	return false
}

// unixName is the name the clients of the unix socket use, for the
// refusal's message, when local is the unix socket.
func unixName(local net.Addr) string {
	if isUnix(local) {
		return `, "agentrun" on the unix socket,`
	}
	return ""
}

// knownHost says whether name (a Host's or an Origin's host, without its
// port) names this server for a request that came in at local (nil when
// not known).
func knownHost(name string, local net.Addr, sc *config.Server) bool {
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return false
	}
	if strings.EqualFold(name, "localhost") || (isUnix(local) && strings.EqualFold(name, "agentrun")) {
		return true
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		ip = ip.Unmap()
		if ip.IsLoopback() {
			return true
		}
		if tcp, ok := local.(*net.TCPAddr); ok {
			if a, ok := netip.AddrFromSlice(tcp.IP); ok && a.Unmap() == ip.WithZone("") {
				return true
			}
		}
	}
	if sc.Listen.Network == "tcp" {
		if h, _, err := net.SplitHostPort(sc.Listen.Address); err == nil && sameHost(name, h) {
			return true
		}
	}
	for _, h := range sc.Hosts {
		if sameHost(name, h) {
			return true
		}
	}
	return false
}

// sameHost says whether the host names a and b are the same: the same IP
// address however written, or the same name in any case.
func sameHost(a, b string) bool {
	x, errA := netip.ParseAddr(a)
	y, errB := netip.ParseAddr(b)
	if errA == nil || errB == nil {
		return errA == nil && errB == nil && x.Unmap() == y.Unmap()
	}
	return strings.EqualFold(a, b)
}

// isUnix says whether local is a unix socket's address.
func isUnix(local net.Addr) bool {
	_, ok := local.(*net.UnixAddr)
	return ok
}

// hostName is the host of a Host header, without its port and an IPv6
// address's brackets.
func hostName(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	if h, ok := strings.CutPrefix(hostport, "["); ok {
		return strings.TrimSuffix(h, "]")
	}
	return hostport
}

// originHost is the host of an Origin header, "" when it has none (an
// opaque origin, "null", or not an http(s) origin).
func originHost(origin string) string {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	return u.Hostname()
}

// quoteShort is s quoted, cut to its first 100 bytes: a header's words
// in a refusal.
func quoteShort(s string) string {
	if len(s) > 100 {
		return fmt.Sprintf("%q...", s[:100])
	}
	return fmt.Sprintf("%q", s)
}
