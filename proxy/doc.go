// Package proxy is a run's egress gate: a DNS server, an HTTP proxy and
// transparent listeners inside the run's gateway namespace that let the
// sandbox reach only allowlisted names on allowlisted ports. What a
// policy says (allowlist entries, address ranges, services' rules) and
// the report's records are internal/netpolicy's; the proxy enforces them.
// It takes them parsed and validated (a *netpolicy.Allowlist and
// validated *netpolicy.Service values, which it never changes) and
// checks at Bind only what those cannot hold already.
//
// It never dials a host not on the allowlist, never dials an address that
// netpolicy.CheckAddr refuses, never dials the host's own addresses
// (internal/hostaddr) but the address:port pairs of Policy.HostPorts and
// services' upstreams, and never forwards a DNS query. A proxy
// opened ahead of its run (Open) reaches nothing until Bind gives it that
// run's policy, once.
package proxy
