package proxy

import "github.com/agentrun/agentrun/internal/netpolicy"

// serviceFor returns the service at host:port, if one is.
func (p *Proxy) serviceFor(t target) *netpolicy.Service {
	for _, s := range p.services {
		if s.Host() == t.host && s.Port() == t.port {
			return s
		}
	}
	return nil
}
