package server

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/agentrun/agentrun/proxy"
)

// The throttle of wrong tokens (server.token guessed as a bearer header,
// on the API and the approvals page, or in the page's login form): each
// source may get the token wrong guessBurst times, then once per
// guessEvery. A source is the client's IP address, an IPv6 one by its
// /64; every client of the unix socket is one source, and so is every
// client behind one reverse proxy, and every sandbox's connection through
// its run's proxy (egressSource). A source with no guess left has its
// requests that carry a token refused (429, Retry-After) before the token
// is compared, so a right guess made then is not told apart from a wrong
// one; a right token never costs a guess, and a request with no token is
// no guess at all.
//
// At most maxGuessSources sources are remembered. When a new one comes
// and the table is full, the sources whose limiters are full again (they
// have not guessed for a while) are dropped; if none is, the new source
// shares one overflow limiter with every other source not remembered, so
// that many addresses guessing at once slow each other (and an operator
// coming from a new address then) rather than grow the table.
const (
	guessBurst      = 10
	guessEvery      = 2 * time.Second
	maxGuessSources = 4096
)

// unixSource is the one source of every client of the unix socket (and
// of any connection whose address is not an IP address).
const unixSource = "unix"

// egressSource is the one source of every connection that a run's proxy
// of this process dialled for its sandbox (serve's own address listed in
// network.host_ports): whatever address it comes from, a sandbox's guess
// never costs the operator's clients at that address theirs.
const egressSource = "sandbox egress"

// isEgress is proxy.IsEgress; a test may replace it.
var isEgress = proxy.IsEgress

// guesses is the throttle; its zero value is ready. It is safe for
// concurrent use.
type guesses struct {
	mu        sync.Mutex
	now       func() time.Time // time.Now when nil; set by the tests
	sources   map[string]*rate.Limiter
	overflow  *rate.Limiter
	lastSweep time.Time
}

func newGuessLimiter() *rate.Limiter { return rate.NewLimiter(rate.Every(guessEvery), guessBurst) }

// guessSource is the source r comes from.
func guessSource(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return unixSource
	}
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && isEgress(ap, local.AddrPort()) {
		return egressSource
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.WithZone("").Prefix(64)
	return p.String()
}

// try checks a token r carries with right, which says whether it is the
// token. wait > 0: r's source has no guess left, right was not called,
// and it may guess again after wait. Otherwise ok is right's answer, and
// a wrong token cost the source a guess.
func (g *guesses) try(r *http.Request, right func() bool) (ok bool, wait time.Duration) {
	src := guessSource(r)
	g.mu.Lock()
	now := time.Now()
	if g.now != nil {
		now = g.now()
	}
	lim := g.limiter(src, now)
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
	if lim != g.overflow && lim.TokensAt(now) >= guessBurst {
		delete(g.sources, src)
	}
	return true, 0
}

// limiter is src's limiter, made if need be; g.mu is held.
func (g *guesses) limiter(src string, now time.Time) *rate.Limiter {
	if lim := g.sources[src]; lim != nil {
		return lim
	}
	if g.sources == nil {
		g.sources = map[string]*rate.Limiter{}
		g.overflow = newGuessLimiter()
	}
	// A sweep of the whole table at most once per guessEvery, which is
	// as often as a limiter can have become full again.
	if len(g.sources) >= maxGuessSources && now.Sub(g.lastSweep) >= guessEvery {
		g.lastSweep = now
		for s, lim := range g.sources {
			if lim.TokensAt(now) >= guessBurst {
				delete(g.sources, s)
			}
		}
	}
	if len(g.sources) >= maxGuessSources {
		return g.overflow
	}
	lim := newGuessLimiter()
	g.sources[src] = lim
	return lim
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
