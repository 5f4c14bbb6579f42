package runner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/state"
	"github.com/agentrun/agentrun/internal/toolbroker"
	"github.com/agentrun/agentrun/proxy"
	"github.com/agentrun/agentrun/runtime/cgroup"
)

// toolBroker makes the broker of req's run, which names tools: the
// servers and bounds of its plan (those of the config that admitted it,
// whatever a reload did since), the config's approval timeout, its held
// calls decided as its held requests are, its calls counted by
// req.toolCount. Each stdio server takes a uid of its own from run_uids,
// its reservation owned by the run's dir (dir), and those whose config
// names hosts get a network of their own (toolNetwork).
func (r *Runner) toolBroker(req request, dir string) (*toolbroker.Broker, error) {
	servers, err := toolbroker.ServersFromConfig(req.plan.ToolServers, req.plan.Tools)
	if err != nil {
		return nil, err
	}
	b, err := toolbroker.New(toolbroker.Options{
		Run: req.id, Servers: servers, Limits: toolbroker.LimitsFromConfig(req.plan.ToolLimits),
		Approve: req.approve, ApprovalTimeout: r.cfg.Network.ApprovalTimeout.Duration(),
		CgroupParent: r.cfg.ToolsCgroupParent(), CgroupLockDir: toolsDir(r.cfg), Shared: r.sharedTools,
		UIDs: r.uids, UIDOwner: dir, Network: r.toolNetwork,
		Count: req.toolCount, Logf: r.logf,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the tool broker: %w", err)
	}
	return b, nil
}

// toolNetwork is the network of stdio tool server s, whose config names
// hosts (its allow): a sandbox's pair of namespaces joined by a veth
// (netns), and a proxy in the gateway's (proxy) that lets it reach those
// hosts alone, under the config's network.hosts and ranges and the
// default net_bytes and net_connections: never an address of the host's
// own (it has no host_ports), a service or the tool broker. Its record is
// dropped. Close tears it all down.
func (r *Runner) toolNetwork(s toolbroker.Server) (_ *toolbroker.Network, err error) {
	allow, err := netpolicy.ParseAllow(s.Allow)
	if err != nil {
		return nil, err
	}
	lim, err := config.Limits{}.Resolve(r.cfg.Limits, r.cfg.Policy.Limits)
	if err != nil {
		return nil, err
	}
	var undo cleanup.Cleanup
	defer func() {
		if err != nil {
			undo.Clean()
		}
	}()
	n, err := r.nets.Setup()
	if err != nil {
		return nil, err
	}
	undo.Add(n.Close)
	prx, err := proxy.Open(n)
	if err != nil {
		return nil, err
	}
	undo.Add(prx.Close) // before the namespaces: its sockets hold the gateway's
	if err := prx.Bind(proxy.Policy{Allow: allow, Hosts: r.cfg.Network.Hosts,
		AllowRanges: r.cfg.Network.AllowRanges, DenyRanges: r.cfg.Network.DenyRanges,
		MaxBytes: lim.NetBytes, MaxConns: int(lim.NetConns)}); err != nil {
		return nil, err
	}
	ns, err := os.Open(n.SandboxPath)
	if err != nil {
		return nil, fmt.Errorf("opening the network namespace: %w", err)
	}
	return &toolbroker.Network{Netns: ns, Env: prx.Env(), ResolvConf: prx.ResolvConf(), Hosts: prx.Hosts(), Close: undo.Clean}, nil
}

// toolsDir is the state dir of the tool servers: their cgroup-parent
// lock.
func toolsDir(cfg *config.Config) string { return filepath.Join(cfg.StateDir, "tools") }

// logf is r.Logf, or nothing.
func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// removeToolsParent removes the tool servers' cgroup parent in every
// hierarchy where it is empty, unless a server's cgroup is being made in
// it (the cgroup-parent lock in toolsDir, which the broker takes).
func (r *Runner) removeToolsParent() {
	dir := toolsDir(r.cfg)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return
	}
	unlock, err := state.LockCgroupParent(dir, true)
	if err != nil {
		return // a server's cgroup is being made: its end removes the parent
	}
	defer unlock()
	// RemoveParent of a cgroup in the parent removes the parent alone,
	// and only where it is empty.
	if cg, err := cgroup.Open(r.cfg.ToolsCgroupParent() + "/-"); err == nil {
		cg.RemoveParent()
	}
}

// cleanToolCgroups kills every process of the stdio tool servers'
// cgroups of run id, which is dead, and removes them, then the tools'
// cgroup parent if that leaves it empty. A server's process dies with
// the agentrun that started it (Pdeathsig); its cgroup stays until now.
func (r *Runner) cleanToolCgroups(id string) error {
	parent := r.cfg.ToolsCgroupParent()
	names := map[string]bool{}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/*"} {
		dirs, _ := filepath.Glob(filepath.Join(root, parent, "tool-"+id+"-*"))
		for _, d := range dirs {
			names[filepath.Base(d)] = true
		}
	}
	var errs []error
	for name := range names {
		cg, err := cgroup.Open(parent + "/" + name)
		if err == nil {
			err = errors.Join(cg.Kill(), cg.Remove())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("tool server cgroup %s: %w", name, err))
		}
	}
	if len(names) > 0 {
		r.removeToolsParent()
	}
	return errors.Join(errs...)
}
