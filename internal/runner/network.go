package runner

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/internal/launcher"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy"
	"github.com/agentrun/agentrun/runtime/spec"
)

// network gives a run with an allowlist its own sandbox namespace, joined by
// a veth to a gateway namespace where this process's proxy and DNS server
// listen, and returns the spec options that put the program there. A run
// with no network (task.Plan.Offline) gets only its /etc/hosts here: its
// spec's fresh network namespace holds only lo, and its result says it
// had no network (result.NoNetwork). What it sets up is undone through sb.undo;
// sb.settle stops the proxy and puts its report in req.res once the
// program has ended, before the result is handed out.
//
// A sandbox made ahead for the pool (req.pooled) gets all of the above
// but the policy, which no run has yet. Its proxy is left unbound (it
// denies everything) until the run that takes the sandbox binds its own
// (bindNetwork). What the spec holds of the network (the namespace, the
// gateway's address in the proxy variables, resolv.conf and hosts) is the
// same for every policy.
//
// A run with services also gets the proxy's CA: its certificate alone and
// a bundle of it with the image's own roots, mounted read-only under
// CADir, named by the usual variables and mounted over the image's system
// bundle (rootfs is the run's own view of the image, an overlay). Held
// requests are decided by req.approve (nil: all denied). The CA is the
// run's own, minted when its policy is bound, and its certificate is in
// the spec's mounts: a run with services is never made ahead.
func (r *Runner) network(req request, rootfs, dir string, sb *sandbox) ([]spec.SpecOpt, error) {
	p := req.plan
	if p.Offline() {
		// No network: the loopback alone, which /etc/hosts still names
		// (the image's is an empty mount point).
		hosts, err := writeEtc(dir, &sb.undo, "hosts", proxy.LocalHosts())
		if err != nil {
			return nil, fmt.Errorf("writing hosts: %w", err)
		}
		opts := []spec.SpecOpt{spec.WithReadonlyFile(hosts, "/etc/hosts")}
		if req.live {
			// A live sandbox's ports are dialled inside its namespace:
			// this process holds it, a loopback alone as the spec's
			// fresh one would be.
			n, err := netns.Loopback()
			if err != nil {
				return nil, fmt.Errorf("setting up the sandbox's loopback: %w", err)
			}
			sb.undo.Add(n.Close)
			sb.net = n
			opts = append(opts, spec.WithNetworkNamespace(n.SandboxPath))
		}
		return opts, nil
	}
	var pol proxy.Policy
	if !req.pooled {
		// Checked before anything is made.
		var err error
		if pol, err = r.policy(p, req.approve); err != nil {
			return nil, err
		}
	} else if len(p.Services) > 0 || len(p.Tools) > 0 {
		return nil, errors.New("a sandbox for a run with services or tools is never made ahead")
	}
	n, err := r.nets.Setup()
	if err != nil {
		return nil, fmt.Errorf("setting up the run's network: %w", err)
	}
	sb.undo.Add(n.Close)
	sb.net = n
	prx, err := proxy.Open(n)
	if err != nil {
		return nil, fmt.Errorf("starting the egress proxy: %w", err)
	}
	// The proxy closes before the namespaces (its sockets hold the gateway's).
	// Close is idempotent: settle has done it already after a run.
	sb.undo.Add(prx.Close)
	sb.proxy = prx
	resolv, err := writeEtc(dir, &sb.undo, "resolv.conf", prx.ResolvConf())
	if err != nil {
		return nil, fmt.Errorf("writing resolv.conf: %w", err)
	}
	hosts, err := writeEtc(dir, &sb.undo, "hosts", prx.Hosts())
	if err != nil {
		return nil, fmt.Errorf("writing hosts: %w", err)
	}
	opts := []spec.SpecOpt{
		spec.WithNetworkNamespace(n.SandboxPath),
		spec.WithReadonlyFile(resolv, "/etc/resolv.conf"),
		spec.WithReadonlyFile(hosts, "/etc/hosts"),
		spec.WithEnv(prx.Env()),
	}
	if req.pooled {
		return opts, nil
	}
	if len(p.Tools) > 0 {
		toolOpts, err := r.tools(req, dir, sb, &pol)
		if err != nil {
			return nil, err
		}
		opts = append(opts, toolOpts...)
	}
	if err := bind(sb, pol, req.res); err != nil {
		return nil, err
	}
	if ca := prx.CACert(); ca != nil {
		caOpts, err := trustCA(ca, rootfs, dir, &sb.undo)
		if err != nil {
			return nil, err
		}
		opts = append(opts, caOpts...)
	}
	return opts, nil
}

// tools makes the broker of req's run, which names tools, for pol to
// serve as tools.agentrun, and returns the spec options of its Python
// module (launcher.ToolsOpts). The broker is closed, and its record put in req.res, once the
// program has ended (sb.settle), or on undo.
func (r *Runner) tools(req request, dir string, sb *sandbox, pol *proxy.Policy) ([]spec.SpecOpt, error) {
	b, err := r.toolBroker(req, dir)
	if err != nil {
		return nil, err
	}
	sb.undo.Add(b.Close)
	pol.Tools = b.Handler()
	res := req.res
	sb.settle.Add(func() error {
		err := b.Close()
		res.Tools = b.Report()
		return err
	})
	return launcher.ToolsOpts(etcWriter(dir, &sb.undo))
}

// bindNetwork gives the proxy of sb, a sandbox made ahead, the policy of
// p, the run that took it, whose result is res.
func (r *Runner) bindNetwork(sb *sandbox, p *task.Plan, approve approvals.Func, res *result.Result) error {
	pol, err := r.policy(p, approve)
	if err != nil {
		return err
	}
	return bind(sb, pol, res)
}

// bind binds the proxy of sb to pol, and has sb.settle put the proxy's
// report in res.
func bind(sb *sandbox, pol proxy.Policy, res *result.Result) error {
	if err := sb.proxy.Bind(pol); err != nil {
		return fmt.Errorf("starting the egress proxy: %w", err)
	}
	prx := sb.proxy
	sb.settle.Add(func() error {
		res.Network = prx.Report()
		return prx.Close()
	})
	return nil
}

// policy is what the proxy lets p reach: its allowlist and services, under
// the config's hosts, ranges, host_ports and the run's network limits.
func (r *Runner) policy(p *task.Plan, approve approvals.Func) (proxy.Policy, error) {
	services, roots, timeout, err := r.services(p)
	if err != nil {
		return proxy.Policy{}, err
	}
	return proxy.Policy{
		Allow: p.Allow, Hosts: r.cfg.Network.Hosts,
		AllowRanges: r.cfg.Network.AllowRanges, DenyRanges: r.cfg.Network.DenyRanges, HostPorts: r.cfg.Network.HostPorts,
		MaxBytes: p.Limits.NetBytes, MaxConns: int(p.Limits.NetConns),
		Services: services, UpstreamRoots: roots, Approve: approve, ApprovalTimeout: timeout,
	}, nil
}

// IsEgress reports whether a connection that a server of this process
// accepted from client at its own address server is one that a run's
// proxy dialled for its sandbox and still holds open (serve's address
// listed in network.host_ports): the sandbox's, whatever address it
// comes from. Serve's throttle of wrong tokens counts all of them as one
// source.
func IsEgress(client, server netip.AddrPort) bool {
	return proxy.IsEgress(client, server)
}

// PeerUID says which user of this host owns the socket at the other end
// of a TCP connection that a server of this process accepted from client,
// an address of the host's own, at its own address server
// (hostaddr.PeerUID). Serve's throttle of wrong tokens counts each such
// user as a source of its own.
func PeerUID(client, server netip.AddrPort) (uint32, bool) {
	return hostaddr.PeerUID(client, server)
}
