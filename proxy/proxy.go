package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/time/rate"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/netns"
)

// Ports of the gateway's own listeners.
const (
	DNSPort   = 53
	ProxyPort = 3128
)

const (
	headTimeout    = 10 * time.Second // to read a request head or ClientHello
	connectTimeout = 15 * time.Second // to resolve and dial upstream
	maxDenied      = 1000             // distinct denial and failure records kept, each

	// Connections from the sandbox to the gateway's listeners (proxy,
	// transparent and DNS over TCP) open at once: MaxConns plus
	// clientSlack for heads still being read and DNS queries, or
	// unlimitedClients+clientSlack when MaxConns is 0. A connection over
	// the cap is closed as soon as it is accepted.
	clientSlack      = 32
	unlimitedClients = 256
)

// MaxClients is the number of connections from the sandbox to the
// gateway's listeners that a run with policy p may have open at once.
func (p Policy) MaxClients() int {
	if p.MaxConns == 0 {
		return unlimitedClients + clientSlack
	}
	return p.MaxConns + clientSlack
}

// Policy is what a run may reach. The zero value allows nothing.
type Policy struct {
	// Allow is the parsed allowlist (netpolicy.ParseAllow); nil allows
	// nothing. Bind never changes it.
	Allow *netpolicy.Allowlist
	// Hosts maps names to fixed addresses, consulted before the resolver
	// (like /etc/hosts). The address is still checked (netpolicy.Dest).
	Hosts map[string]netip.Addr
	// AllowRanges opens ranges netpolicy.CheckAddr would refuse; DenyRanges adds
	// refusals and wins over everything.
	AllowRanges, DenyRanges []netip.Prefix
	// HostPorts are the host's own address:port pairs a connection may
	// reach (network.host_ports). Every other address the host owns is
	// refused, whatever the ranges, except to a service's upstream.
	HostPorts []netip.AddrPort
	// Own reports whether an address is the host's own, asked when a
	// connection is dialled; nil means hostaddr.Own.
	Own func(netip.Addr) (bool, error)
	// MaxBytes caps the bytes of a run in each direction, over all its
	// connections; a connection that crosses it is cut. 0 means no cap.
	MaxBytes int64
	// MaxConns caps the upstream connections open at once. 0 means no cap.
	MaxConns int
	// Resolver resolves an allowed name on the host; nil means
	// net.DefaultResolver (asked for the fully qualified name, so the
	// host's search domains never apply).
	Resolver func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial connects to the checked "ip:port"; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// Services are hosts the proxy answers for itself (see netpolicy.Service): their
	// host:port is reachable without an Allow entry, HTTPS to them is
	// terminated with the run's CA, and only their rules' requests pass.
	// Every other host is never intercepted. Each is validated already
	// (netpolicy.Service.Validate) and may be shared with other proxies:
	// the proxy never changes it.
	Services []*netpolicy.Service
	// UpstreamRoots verifies services' certificates; nil means the host's
	// roots.
	UpstreamRoots *x509.CertPool
	// Approve decides requests that a rule with Approve holds; nil denies
	// them all ("no way to ask").
	Approve approvals.Func
	// ApprovalTimeout is how long a held request waits for a decision
	// before it is denied; 0 means approvals.DefaultTimeout.
	ApprovalTimeout time.Duration

	// Tools, if not nil, is the run's tool broker: the sandbox reaches it
	// as http://tools.agentrun (ToolsHost, ToolsPort), whose DNS answer is
	// the gateway, through the explicit proxy or the transparent
	// listener. Nothing is dialled for it and nothing of it is recorded
	// here: the broker records its calls.
	Tools http.Handler
}

// Proxy is one run's DNS server, HTTP proxy and transparent listeners.
type Proxy struct {
	n  *netns.Net // where Bind opens the transparent listeners; nil in unit tests
	gw netip.Addr

	// bound is set once Bind has set the fields below, which never change
	// after; a handler that does not see it set reads none of them.
	bound     atomic.Bool
	bindTried bool // under mu: Bind was called

	allow   *netpolicy.Allowlist
	hosts   map[string]netip.Addr
	policy  Policy
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)

	services []*netpolicy.Service
	ca       *CA             // nil without services
	upstream *http.Transport // to services

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the proxy started

	bytesIn, bytesOut atomic.Int64

	mu        sync.Mutex
	closed    bool
	listeners []net.Listener
	dnsSrv    []*dns.Server
	conns     map[net.Conn]struct{} // client and upstream connections
	upstreams int                   // open upstream connections
	clients   int                   // open connections from the sandbox

	held     int           // requests waiting for approval
	heldRate *rate.Limiter // of requests held for approval

	// ledger is what Report returns, under a lock of its own.
	ledger ledger

	closeOnce sync.Once
	closeErr  error
}

// Start validates p and starts the proxy's listeners inside n's gateway
// namespace: DNS on :53 (udp and tcp), the HTTP proxy on :3128, and one
// transparent listener on each port the allowlist names (other than 53
// and 3128), which routes each connection by its TLS server name or HTTP
// Host header. Upstream connections leave from the host namespace. It is
// Open and Bind in one.
func Start(n *netns.Net, p Policy) (*Proxy, error) {
	px, err := Open(n)
	if err != nil {
		return nil, err
	}
	if err := px.Bind(p); err != nil {
		px.Close()
		return nil, err
	}
	return px, nil
}

// Open starts the listeners of a proxy with no policy yet inside n's
// gateway namespace: DNS on :53 (udp and tcp) and the HTTP proxy on :3128.
// Until Bind, the proxy reaches nothing and records nothing: it answers
// every DNS query REFUSED and every connection to :3128 with a 403. A
// sandbox's network can so be made ahead of the run that will use it.
func Open(n *netns.Net) (*Proxy, error) {
	if n == nil {
		return nil, errors.New("starting proxy: no network")
	}
	gw, ok := netip.AddrFromSlice(n.Gateway.To4())
	if !ok {
		return nil, fmt.Errorf("starting proxy: gateway address %v is not IPv4", n.Gateway)
	}
	px := unbound(gw)
	px.n = n
	if err := px.listen(n); err != nil {
		px.Close()
		return nil, err
	}
	return px, nil
}

// Bind gives the proxy its run's policy, once: it checks p (its
// allowlist and services come parsed and validated; see setPolicy), opens the
// transparent listeners p's allowlist asks for, and from then on serves
// by p. A proxy is bound at most once, whatever the outcome: a second
// Bind fails and leaves the first policy (or none) in force, so a proxy
// made for one run never serves another's policy.
func (p *Proxy) Bind(pol Policy) error {
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return errors.New("binding proxy policy: proxy closed")
	case p.bindTried:
		p.mu.Unlock()
		return errors.New("binding proxy policy: a policy is bound already")
	}
	p.bindTried = true
	p.mu.Unlock()
	if err := p.setPolicy(pol); err != nil {
		return err
	}
	if p.n != nil {
		if err := p.listenTransparent(p.n); err != nil {
			return err
		}
	}
	// Handlers read the policy only once they see this (after the
	// fields above are set); until then they deny.
	p.bound.Store(true)
	return nil
}

// unbound is a proxy at gateway address gw with no policy and no
// listeners.
func unbound(gw netip.Addr) *Proxy {
	px := &Proxy{
		gw:       gw,
		conns:    make(map[net.Conn]struct{}),
		heldRate: rate.NewLimiter(rate.Every(heldEvery), maxHeld),
	}
	px.ctx, px.cancel = context.WithCancel(context.Background())
	return px
}

// setPolicy checks what pol's parsed values cannot hold already (hosts
// entries, limits, host_ports, services that are not validated or share
// a host and port) and sets what the proxy serves by from it.
func (p *Proxy) setPolicy(pol Policy) error {
	hosts := make(map[string]netip.Addr, len(pol.Hosts))
	for name, a := range pol.Hosts {
		h, ok := netpolicy.CanonicalName(name)
		if !ok {
			return fmt.Errorf("starting proxy: hosts entry %q: not a valid host name", name)
		}
		if !a.IsValid() {
			return fmt.Errorf("starting proxy: hosts entry %q: no address", name)
		}
		hosts[h] = a.Unmap()
	}
	if pol.MaxBytes < 0 || pol.MaxConns < 0 {
		return errors.New("starting proxy: negative limit")
	}
	allow, services, err := servicesOf(pol)
	if err != nil {
		return err
	}
	if pol.Tools != nil {
		for _, s := range services {
			if s.Host() == ToolsHost {
				return fmt.Errorf("starting proxy: service %q is at %s, the tool broker's name", s.Name, ToolsHost)
			}
		}
		allow.AllowExact(ToolsHost, ToolsPort)
	}
	var ca *CA
	if len(services) > 0 {
		if ca, err = NewCA(); err != nil {
			return fmt.Errorf("starting proxy: %w", err)
		}
	}
	resolve, dial := pol.Resolver, pol.Dial
	if resolve == nil {
		resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host+".")
		}
	}
	if dial == nil {
		d := &net.Dialer{}
		dial = d.DialContext
	}
	if pol.Own == nil {
		pol.Own = hostaddr.Own
	}
	pol.HostPorts = slices.Clone(pol.HostPorts)
	for i, hp := range pol.HostPorts {
		if !hp.Addr().IsValid() || hp.Port() == 0 {
			return fmt.Errorf("starting proxy: host_ports entry %d (%s): not an address and port", i, hp)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allow, p.hosts, p.policy = allow, hosts, pol
	p.resolve, p.dial = resolve, dial
	p.services, p.ca = services, ca
	if len(services) > 0 {
		p.upstream = p.newUpstream()
	}
	return nil
}

// servicesOf returns pol's allowlist grown by its services' host:port
// pairs (a copy: pol.Allow is left as it is) and its services, or why
// they cannot be served: one not validated, two at the same host and
// port.
func servicesOf(pol Policy) (*netpolicy.Allowlist, []*netpolicy.Service, error) {
	allow := pol.Allow.Clone()
	services := slices.Clone(pol.Services)
	seen := map[target]string{}
	for i, s := range services {
		if s == nil || s.Authority() == "" {
			return nil, nil, fmt.Errorf("starting proxy: services[%d] is not validated", i)
		}
		hp := target{s.Host(), s.Port()}
		if other, dup := seen[hp]; dup {
			return nil, nil, fmt.Errorf("starting proxy: services %q and %q are both at %s", other, s.Name, s.Authority())
		}
		seen[hp] = s.Name
		allow.AllowExact(s.Host(), s.Port())
	}
	return allow, services, nil
}

// listen opens the DNS and HTTP proxy listeners inside the gateway
// namespace and starts serving them.
func (p *Proxy) listen(n *netns.Net) error {
	at := func(port int) string { return net.JoinHostPort(p.gw.String(), strconv.Itoa(port)) }

	udp, err := n.ListenPacket("udp4", at(DNSPort))
	if err != nil {
		return fmt.Errorf("starting dns server: %w", err)
	}
	if err := p.serveDNS(&dns.Server{PacketConn: udp}); err != nil {
		udp.Close()
		return err
	}
	tcp, err := n.Listen("tcp4", at(DNSPort))
	if err != nil {
		return fmt.Errorf("starting dns server: %w", err)
	}
	if err := p.serveDNS(&dns.Server{Listener: clientListener{tcp, p}, MaxTCPQueries: 16}); err != nil {
		tcp.Close()
		return err
	}

	l, err := n.Listen("tcp4", at(ProxyPort))
	if err != nil {
		return fmt.Errorf("starting http proxy: %w", err)
	}
	if !p.goAccept(l, p.handleProxy) {
		return errors.New("starting http proxy: proxy closed")
	}
	return nil
}

// listenTransparent opens a transparent listener on each port the bound
// allowlist names (other than 53 and 3128) and starts serving them.
func (p *Proxy) listenTransparent(n *netns.Net) error {
	at := func(port int) string { return net.JoinHostPort(p.gw.String(), strconv.Itoa(port)) }
	for _, port := range p.allow.Ports() {
		if port == DNSPort || port == ProxyPort {
			continue // reachable through CONNECT only
		}
		l, err := n.Listen("tcp4", at(port))
		if err != nil {
			return fmt.Errorf("starting transparent listener: %w", err)
		}
		if !p.goAccept(l, func(c net.Conn) { p.handleTransparent(c, port) }) {
			return errors.New("starting transparent listener: proxy closed")
		}
	}
	return nil
}

// goTracked runs fn on a goroutine that Close waits for. It reports false,
// running nothing, once the proxy is closed.
func (p *Proxy) goTracked(fn func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		fn()
	}()
	return true
}

// track registers c so that Close closes it; false means the proxy is
// closed and c has been closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// goAccept serves l until it is closed, each connection on a goroutine.
func (p *Proxy) goAccept(l net.Listener, handle func(net.Conn)) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return false
	}
	p.listeners = append(p.listeners, l)
	p.mu.Unlock()
	return p.goTracked(func() {
		var delay time.Duration
		for {
			c, err := l.Accept()
			if err != nil {
				if p.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				// Out of fds or similar: back off, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
				case <-p.ctx.Done():
					return
				}
				continue
			}
			delay = 0
			if !p.takeClient(c) {
				continue
			}
			if !p.track(c) {
				p.releaseClient()
				return
			}
			if !p.goTracked(func() { defer p.releaseClient(); defer p.untrack(c); handle(c) }) {
				p.untrack(c)
				p.releaseClient()
				return
			}
		}
	})
}

// takeClient counts c against the run's cap on connections from the
// sandbox; over the cap c is closed and the refusal recorded.
func (p *Proxy) takeClient(c net.Conn) bool {
	p.mu.Lock()
	ok := p.clients < p.policy.MaxClients()
	if ok {
		p.clients++
	}
	p.mu.Unlock()
	if !ok {
		port := 0
		if a, isTCP := c.LocalAddr().(*net.TCPAddr); isTCP {
			port = a.Port
		}
		// Reset, not a graceful close: nothing of it lingers in the kernel.
		if tc, isTCP := c.(*net.TCPConn); isTCP {
			tc.SetLinger(0)
		}
		c.Close()
		p.ledger.deny("", port, reasonTooManyClients)
	}
	return ok
}

func (p *Proxy) releaseClient() {
	p.mu.Lock()
	p.clients--
	p.mu.Unlock()
}

// clientListener applies the cap on connections from the sandbox to a
// listener served by someone else (the DNS server over TCP).
type clientListener struct {
	net.Listener
	p *Proxy
}

func (l clientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.p.takeClient(c) {
			return &clientConn{Conn: c, p: l.p}, nil
		}
	}
}

// clientConn gives its slot back when closed.
type clientConn struct {
	net.Conn
	p    *Proxy
	once sync.Once
}

func (c *clientConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.p.releaseClient)
	return err
}

// serveDNS starts srv (with its PacketConn or Listener set) and waits
// until it serves.
func (p *Proxy) serveDNS(srv *dns.Server) error {
	started := make(chan struct{})
	srv.Handler = dns.HandlerFunc(p.answer)
	srv.NotifyStartedFunc = func() { close(started) }
	srv.ReadTimeout = 5 * time.Second
	srv.WriteTimeout = 5 * time.Second
	srv.IdleTimeout = func() time.Duration { return 5 * time.Second }
	errc := make(chan error, 1)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("starting dns server: proxy closed")
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		errc <- srv.ActivateAndServe()
	}()
	p.mu.Unlock()
	select {
	case <-started:
		p.mu.Lock()
		p.dnsSrv = append(p.dnsSrv, srv)
		p.mu.Unlock()
		return nil
	case err := <-errc:
		return fmt.Errorf("starting dns server: %w", err)
	}
}

// Close stops every listener, cuts every connection and waits for every
// goroutine the proxy started. It is safe to call more than once.
func (p *Proxy) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		listeners, servers := p.listeners, p.dnsSrv
		conns := make([]net.Conn, 0, len(p.conns))
		for c := range p.conns {
			conns = append(conns, c)
		}
		p.mu.Unlock()
		p.cancel()

		var errs []error
		for _, srv := range servers {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := srv.ShutdownContext(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stopping dns server: %w", err))
			}
			cancel()
		}
		for _, l := range listeners {
			if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("closing listener %s: %w", l.Addr(), err))
			}
		}
		for _, c := range conns {
			c.Close()
		}
		if p.upstream != nil {
			p.upstream.CloseIdleConnections()
		}
		p.wg.Wait()
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// Env is the proxy environment for the sandboxed program.
func (p *Proxy) Env() map[string]string {
	u := "http://" + net.JoinHostPort(p.gw.String(), strconv.Itoa(ProxyPort))
	return map[string]string{
		"HTTP_PROXY":  u,
		"HTTPS_PROXY": u,
		"http_proxy":  u,
		"https_proxy": u,
		"NO_PROXY":    "",
		"no_proxy":    "",
	}
}

// CACert is the run's CA certificate (PEM) that the sandbox must trust to
// talk to services over HTTPS; nil when the run has no services.
func (p *Proxy) CACert() []byte {
	if p.ca == nil {
		return nil
	}
	return p.ca.CertPEM()
}

// ResolvConf is the sandbox's /etc/resolv.conf: the gateway's DNS only.
func (p *Proxy) ResolvConf() []byte {
	return fmt.Appendf(nil, "nameserver %s\noptions ndots:0 timeout:2 attempts:2\n", p.gw)
}

// Hosts is the sandbox's /etc/hosts: localhost only.
func (p *Proxy) Hosts() []byte { return LocalHosts() }

// LocalHosts is the /etc/hosts of every run: localhost on the loopback,
// IPv4 and IPv6.
func LocalHosts() []byte {
	return []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
}

// Report returns a snapshot of what was allowed and denied so far.
func (p *Proxy) Report() netpolicy.Report { return p.ledger.report() }

// printable makes client-supplied text safe for a header, a message and
// the report: printable ASCII only, at most 255 bytes.
func printable(s string) string {
	b := make([]byte, 0, min(len(s), 255))
	for i := 0; i < len(s) && len(b) < 255; i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		b = append(b, c)
	}
	return string(b)
}
