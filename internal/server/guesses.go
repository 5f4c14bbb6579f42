package server

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// The throttle of wrong tokens (server.token guessed as a bearer header,
// on the API and the approvals page, or in the page's login form): each
// source may get the token wrong guessBurst times, then once per
// guessEvery. A source is the client's IP address, an IPv6 one by its
// /64, and every client behind one reverse proxy is one source; every
// sandbox's connection through its run's proxy is one (egressSource). A
// client on this host is told apart by its user, never by its address
// alone: a client of the unix socket by its peer's credentials
// (SO_PEERCRED), a TCP client from an address of the host's own (the
// loopback) by the owner of its socket (Server.PeerUID), so that another
// user of the host (a tool server, say) that spends its guesses never
// spends the operator's. A source with no guess left has its
// requests that carry a token refused (429, Retry-After) before the token
// is compared, so a right guess made then is not told apart from a wrong
// one; a right token never costs a guess, and a request with no token is
// no guess at all.
//
// At most maxGuessSources sources are remembered, and at most
// maxGuessSourcesPerPrefix of one prefix: an IPv4 /24, an IPv6 /48 (a
// site's, or one host's whole allocation). Past its share, a prefix's new
// sources share one overflow limiter of that prefix's own, so that one
// prefix's many addresses slow each other and never the table's other
// sources. When a new source comes and the table (or its prefix's share)
// is full, the sources whose limiters are full again (they have not
// guessed for a while) are dropped; if the table is full still, the new
// source shares one overflow limiter with every other source not
// remembered, so that many prefixes guessing at once slow each other (and
// an operator coming from a new address then) rather than grow the table.
const (
	guessBurst               = 10
	guessEvery               = 2 * time.Second
	maxGuessSources          = 4096
	maxGuessSourcesPerPrefix = 64
)

// unixSource is the one source of every client of the unix socket whose
// user is not known (and of any connection whose address is not an IP
// address), and the prefix of those whose user is; localSource the prefix
// of the TCP clients from the host's own addresses whose user is known.
const (
	unixSource  = "unix"
	localSource = "local"
)

// peers tell a connection's source apart beyond its address: a sandbox's
// egress (Server.Egress) and a local client's user (Server.PeerUID); nil
// tells none.
type peers struct {
	egress func(client, server netip.AddrPort) bool
	uid    func(client, server netip.AddrPort) (uint32, bool)
}

// egressSource is the one source of every connection that a run's proxy
// of this process dialled for its sandbox (serve's own address listed in
// network.host_ports): whatever address it comes from, a sandbox's guess
// never costs the operator's clients at that address theirs.
const egressSource = "sandbox egress"

// guesses is the throttle; its zero value is ready. It is safe for
// concurrent use.
type guesses struct {
	mu        sync.Mutex
	now       func() time.Time // time.Now when nil; set by the tests
	sources   map[string]guessEntry
	prefixes  map[string]*guessPrefix
	overflow  *rate.Limiter
	lastSweep time.Time
}

// guessEntry is a remembered source: its limiter and its prefix.
type guessEntry struct {
	lim    *rate.Limiter
	prefix string
}

// guessPrefix is a prefix of remembered sources: how many, and the
// limiter its sources past maxGuessSourcesPerPrefix share (nil until one
// comes).
type guessPrefix struct {
	n        int
	overflow *rate.Limiter
}

func newGuessLimiter() *rate.Limiter { return rate.NewLimiter(rate.Every(guessEvery), guessBurst) }

// guessSource is the source r comes from and the prefix it is counted in;
// known tells a sandbox's connection and a local client's user.
func guessSource(r *http.Request, known peers) (src, prefix string) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		if uid, ok := unixPeer(r); ok {
			return unixSource + " uid " + strconv.FormatUint(uint64(uid), 10), unixSource
		}
		return unixSource, unixSource
	}
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		if known.egress != nil && known.egress(ap, local.AddrPort()) {
			return egressSource, egressSource
		}
		if known.uid != nil {
			if uid, ok := known.uid(ap, local.AddrPort()); ok {
				return localSource + " uid " + strconv.FormatUint(uint64(uid), 10), localSource
			}
		}
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		p, _ := a.Prefix(24)
		return a.String(), p.String()
	}
	a = a.WithZone("")
	src64, _ := a.Prefix(64)
	p, _ := a.Prefix(48)
	return src64.String(), p.String()
}

// try checks a token r carries with right, which says whether it is the
// token; known tells r's source apart (guessSource). wait > 0: r's source has
// no guess left, right was not called, and it may guess again after wait.
// Otherwise ok is right's answer, and a wrong token cost the source a
// guess.
func (g *guesses) try(r *http.Request, known peers, right func() bool) (ok bool, wait time.Duration) {
	src, prefix := guessSource(r, known)
	g.mu.Lock()
	now := time.Now()
	if g.now != nil {
		now = g.now()
	}
	lim := g.limiter(src, prefix, now)
	if t := lim.TokensAt(now); t < 1 {
		g.mu.Unlock()
		return false, time.Duration((1 - t) * float64(guessEvery))
	}
	res := lim.ReserveN(now, 1) // taken before comparing: parallel guesses cannot pass together
	g.mu.Unlock()
	if !right() {
		return false, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	res.CancelAt(now) // a right token costs nothing
	if e, ok := g.sources[src]; ok && e.lim == lim && lim.TokensAt(now) >= guessBurst {
		g.forget(src, e)
	}
	return true, 0
}

// limiter is src's limiter, made if need be, or the overflow limiter of
// its prefix or of the table; g.mu is held.
func (g *guesses) limiter(src, prefix string, now time.Time) *rate.Limiter {
	if e, ok := g.sources[src]; ok {
		return e.lim
	}
	if g.sources == nil {
		g.sources, g.prefixes = map[string]guessEntry{}, map[string]*guessPrefix{}
		g.overflow = newGuessLimiter()
	}
	// A sweep of the whole table at most once per guessEvery, which is
	// as often as a limiter can have become full again.
	p := g.prefixes[prefix]
	full := len(g.sources) >= maxGuessSources || len(g.prefixes) >= maxGuessSources ||
		(p != nil && p.n >= maxGuessSourcesPerPrefix)
	if full && now.Sub(g.lastSweep) >= guessEvery {
		g.lastSweep = now
		g.sweep(now)
		p = g.prefixes[prefix]
	}
	if p != nil && p.n >= maxGuessSourcesPerPrefix {
		if p.overflow == nil {
			p.overflow = newGuessLimiter()
		}
		return p.overflow
	}
	if len(g.sources) >= maxGuessSources || (p == nil && len(g.prefixes) >= maxGuessSources) {
		return g.overflow
	}
	if p == nil {
		p = &guessPrefix{}
		g.prefixes[prefix] = p
	}
	lim := newGuessLimiter()
	g.sources[src] = guessEntry{lim: lim, prefix: prefix}
	p.n++
	return lim
}

// sweep drops the sources whose limiters are full again, and the
// prefixes left with no source and no guess of their overflow's spent;
// g.mu is held.
func (g *guesses) sweep(now time.Time) {
	for s, e := range g.sources {
		if e.lim.TokensAt(now) >= guessBurst {
			g.forget(s, e)
		}
	}
	for name, p := range g.prefixes {
		if p.n == 0 && (p.overflow == nil || p.overflow.TokensAt(now) >= guessBurst) {
			delete(g.prefixes, name)
		}
	}
}

// forget drops the remembered source src, e; its prefix goes with its
// last source unless its overflow has guesses spent. g.mu is held.
func (g *guesses) forget(src string, e guessEntry) {
	delete(g.sources, src)
	if p := g.prefixes[e.prefix]; p != nil {
		if p.n--; p.n == 0 && p.overflow == nil {
			delete(g.prefixes, e.prefix)
		}
	}
}

// unixPeer is the uid of the process at the other end of r's connection
// when it is a unix socket's, as the kernel recorded it when that process
// connected (SO_PEERCRED).
func unixPeer(r *http.Request) (uint32, bool) {
	c, ok := r.Context().Value(connKey{}).(*net.UnixConn)
	if !ok {
		return 0, false
	}
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return 0, false
	}
	return cred.Uid, true
}

// retryAfter is d as a Retry-After header says it: whole seconds, at
// least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// tooManyGuesses answers 429 to a request whose source has no guess left.
func (s *Server) tooManyGuesses(w http.ResponseWriter, wait time.Duration) {
	s.refuseGuess(w, wait)
	writeError(w, http.StatusTooManyRequests, "", guessMessage(wait))
}

// refuseGuess counts a refusal of the throttle and says when to guess
// again; the caller writes the 429.
func (s *Server) refuseGuess(w http.ResponseWriter, wait time.Duration) {
	s.metrics.GuessRefused()
	w.Header().Set("Retry-After", retryAfter(wait))
}

// guessMessage says why a token was not even compared.
func guessMessage(wait time.Duration) string {
	return "too many wrong tokens from this address: try again in " + retryAfter(wait) + " s"
}
