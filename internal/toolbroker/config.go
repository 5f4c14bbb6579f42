package toolbroker

import (
	"fmt"
	"maps"
	"os/user"
	"slices"
	"strconv"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/netpolicy"
)

// ServersFromConfig is the servers of tools (a config's "tools", or a
// plan's ToolServers) that names (a task's tools) name, in that order. A
// name that tools lacks is refused by policy (errkind.ErrPolicy), as the
// task that names it is. A user name is resolved through the host's
// passwd now; "" is 65534:65534; root is refused.
func ServersFromConfig(tools config.Tools, names []string) ([]Server, error) {
	out := make([]Server, 0, len(names))
	for _, name := range names {
		ts, ok := tools[name]
		if !ok {
			return nil, fmt.Errorf("tools: %q is not a tool server of the config: %w", name, errkind.ErrPolicy)
		}
		s, err := serverFromConfig(name, ts)
		if err != nil {
			return nil, fmt.Errorf("tools[%q]: %w", name, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// serverFromConfig is the broker's form of tools[name].
func serverFromConfig(name string, ts config.ToolServer) (Server, error) {
	s := Server{Name: name, Command: ts.Command, Allow: ts.Allow, Shared: ts.Shared, URL: ts.URL}
	for _, k := range slices.Sorted(maps.Keys(ts.Env)) {
		v := ts.Env[k]
		s.Env = append(s.Env, EnvVar{Name: k, Value: v.Value, Prefix: v.Prefix, File: v.File})
	}
	for _, h := range slices.Sorted(maps.Keys(ts.Headers)) {
		s.Headers = append(s.Headers, netpolicy.Inject{Header: h, Prefix: ts.Headers[h].Prefix, File: ts.Headers[h].File})
	}
	for _, r := range ts.Rules {
		s.Rules = append(s.Rules, Rule{Tools: r.Tools, Approve: r.Approve})
	}
	if len(ts.Command) > 0 {
		uid, gid, err := resolveUser(ts.User)
		if err != nil {
			return Server{}, fmt.Errorf("user: %w", err)
		}
		s.UID, s.GID = uid, gid
	}
	return s, nil
}

// resolveUser is the ids of a stdio server's user (config.ParseToolUser):
// a name through the host's passwd, never root's.
func resolveUser(u string) (uid, gid uint32, err error) {
	name, ids, err := config.ParseToolUser(u)
	if err != nil {
		return 0, 0, err
	}
	if name == "" {
		return ids[0], ids[1], nil
	}
	pw, err := user.Lookup(name)
	if err != nil {
		return 0, 0, fmt.Errorf("%q: %w", name, err)
	}
	for i, s := range []string{pw.Uid, pw.Gid} {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			return 0, 0, fmt.Errorf("%q has id %s: a tool server never runs as root, nor as an id that is not a number", name, s)
		}
		ids[i] = uint32(n)
	}
	return ids[0], ids[1], nil
}

// LimitsFromConfig is l (a config's tool_limits), the defaults in place
// of those unset.
func LimitsFromConfig(l config.ToolLimits) Limits {
	calls, concurrent, argBytes, resBytes, timeout := l.Effective()
	return Limits{Calls: calls, Concurrent: concurrent, ArgumentBytes: argBytes, ResultBytes: resBytes, CallTimeout: timeout}
}
