package proxy

import (
	"net"
	"strings"

	"github.com/miekg/dns"
)

const dnsTTL = 60

// answer serves one DNS query from the sandbox. Allowlisted names get the
// gateway's address (A) or an empty answer (every other type); any other
// name gets NXDOMAIN. Nothing is ever forwarded. Before Bind every query
// is REFUSED.
func (p *Proxy) answer(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.RecursionAvailable = true
	if opt := r.IsEdns0(); opt != nil {
		m.SetEdns0(max(opt.UDPSize(), dns.MinMsgSize), false)
	}
	switch {
	case !p.bound.Load():
		m.Rcode = dns.RcodeRefused // no policy yet: nothing is an answer
	case r.Opcode != dns.OpcodeQuery:
		m.Rcode = dns.RcodeNotImplemented
	case len(r.Question) != 1:
		m.Rcode = dns.RcodeFormatError
	default:
		q := r.Question[0]
		name := strings.TrimSuffix(q.Name, ".")
		switch {
		case q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY:
			m.Rcode = dns.RcodeRefused
		case !p.allow.MatchName(q.Name):
			m.Rcode = dns.RcodeNameError
			p.ledger.deny(strings.ToLower(name), DNSPort, reasonDNS)
		case q.Qtype == dns.TypeA:
			m.Answer = []dns.RR{&dns.A{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
				A:   net.IP(p.gw.AsSlice()),
			}}
		}
	}
	w.WriteMsg(m)
}
