package runner

import (
	"fmt"
	"net/netip"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/proxy"
	"github.com/agentrun/agentrun/runtime/spec"
)

// network gives a run with an allowlist its own sandbox namespace, joined by
// a veth to a gateway namespace where this process's proxy and DNS server
// listen, and returns the spec options that put the program there. A run
// without an allowlist gets nothing here: its spec's fresh network
// namespace holds only lo. What it sets up is undone through undo; settle
// stops the proxy and puts its report in res once the program has ended,
// before the result is handed out.
//
// A run with services also gets the proxy's CA: its certificate alone and
// a bundle of it with the image's own roots, mounted read-only under
// CADir, named by the usual variables and mounted over the image's system
// bundle (rootfs is the run's own view of the image, an overlay). Held
// requests are decided by approve (nil: all denied).
func (r *Runner) network(p *task.Plan, rootfs, dir string, approve proxy.ApproveFunc, res *result.Result, undo, settle *cleanup.Cleanup) ([]spec.SpecOpt, error) {
	if len(p.Allow) == 0 && len(p.Services) == 0 {
		return nil, nil
	}
	services, roots, timeout, err := r.services(p)
	if err != nil {
		return nil, err
	}
	allowRanges, err := prefixes(r.cfg.Network.AllowRanges)
	if err != nil {
		return nil, fmt.Errorf("config network.allow_ranges: %w", err)
	}
	denyRanges, err := prefixes(r.cfg.Network.DenyRanges)
	if err != nil {
		return nil, fmt.Errorf("config network.deny_ranges: %w", err)
	}
	n, err := r.nets.Setup()
	if err != nil {
		return nil, fmt.Errorf("setting up the run's network: %w", err)
	}
	undo.Add(n.Close)
	prx, err := proxy.Start(n, proxy.Policy{
		Allow: p.Allow, Hosts: r.cfg.Network.Hosts,
		AllowRanges: allowRanges, DenyRanges: denyRanges,
		MaxBytes: p.Limits.NetBytes, MaxConns: int(p.Limits.NetConns),
		Services: services, UpstreamRoots: roots, Approve: approve, ApprovalTimeout: timeout,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the egress proxy: %w", err)
	}
	// The proxy closes before the namespaces (its sockets hold the gateway's).
	// Close is idempotent: settle has done it already after a run.
	undo.Add(prx.Close)
	settle.Add(func() error {
		res.Network = networkResult(prx.Report())
		return prx.Close()
	})
	resolv, err := writeEtc(dir, undo, "resolv.conf", prx.ResolvConf())
	if err != nil {
		return nil, fmt.Errorf("writing resolv.conf: %w", err)
	}
	hosts, err := writeEtc(dir, undo, "hosts", prx.Hosts())
	if err != nil {
		return nil, fmt.Errorf("writing hosts: %w", err)
	}
	opts := []spec.SpecOpt{
		spec.WithNetworkNamespace(n.SandboxPath),
		spec.WithReadonlyFile(resolv, "/etc/resolv.conf"),
		spec.WithReadonlyFile(hosts, "/etc/hosts"),
		spec.WithEnv(prx.Env()),
	}
	if ca := prx.CACert(); ca != nil {
		caOpts, err := trustCA(ca, rootfs, dir, undo)
		if err != nil {
			return nil, err
		}
		opts = append(opts, caOpts...)
	}
	return opts, nil
}

func prefixes(ss []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// networkResult is the proxy's report as the result's network section.
func networkResult(r proxy.Report) result.Network {
	return result.Network{
		Allowed: convert(r.Allowed, func(a proxy.Allowed) result.Allowed { return result.Allowed(a) }),
		Denied:  convert(r.Denied, func(d proxy.Denied) result.Denied { return result.Denied(d) }),
		Failed:  convert(r.Failed, func(f proxy.Failed) result.Failed { return result.Failed(f) }),
		Requests: convert(r.Requests, func(q proxy.ServiceRequest) result.ServiceRequest {
			return result.ServiceRequest(q)
		}),
		Approvals:       convert(r.Approvals, func(a proxy.ApprovalRecord) result.Approval { return result.Approval(a) }),
		RequestsDropped: r.RequestsDropped,
	}
}

// convert maps in through f, keeping nil as nil.
func convert[F, T any](in []F, f func(F) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}
