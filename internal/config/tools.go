package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// Tools is the config's "tools": the MCP tool servers a task may name in
// its "tools" (spec §13), by name.
type Tools map[string]ToolServer

// ToolServer is one MCP server agentrun brokers calls to: a stdio Command
// started for the run that names it, or a streamable-HTTP URL. Exactly one
// of Command and URL is set.
type ToolServer struct {
	// Command is the server's argv, argv[0] absolute. It runs as User,
	// with Env alone for its environment, in a cgroup of its own, and is
	// stopped at the end of the run that started it.
	Command []string `json:"command,omitempty"`
	// Env is the stdio server's whole environment: each value is Prefix
	// then the content of File (a root-only file, read when the server
	// starts), or Value as it is.
	Env map[string]ToolValue `json:"env,omitempty"`
	// User is the stdio server's user: a name of the host's passwd or
	// "uid:gid"; "" means nobody (65534:65534). Never root. As root,
	// agentrun runs the server as a uid and gid of its own from run_uids,
	// with User's group as its supplementary group (none for nobody's).
	User string `json:"user,omitempty"`
	// Allow is the hosts the stdio server may reach, in network.allow's
	// syntax, through a proxy of its own; none: it has no network at all.
	Allow []string `json:"allow,omitempty"`
	// Shared keeps one stdio server for every run that names it, started
	// at the first call and stopped when agentrun exits, instead of one
	// per run. Off by default: a shared server sees every run's calls.
	Shared bool `json:"shared,omitempty"`

	// URL is a streamable-HTTP server's endpoint (http or https).
	URL string `json:"url,omitempty"`
	// Headers are sent with every request to URL, each value Prefix then
	// the content of File (as a service's inject).
	Headers map[string]Inject `json:"headers,omitempty"`

	// Rules decide which tools the program may call; a tool no rule
	// allows is refused.
	Rules []ToolRule `json:"rules"`
}

// ToolValue is an environment value of a stdio tool server: Value, or
// Prefix then the content of the root-only File.
type ToolValue struct {
	Value  string `json:"value,omitempty"`
	Prefix string `json:"prefix,omitempty"`
	File   string `json:"file,omitempty"`
}

// ToolRule allows the tools whose names match one of Tools (path.Match
// globs: "get_*"), held for a human when Approve is set.
type ToolRule struct {
	Tools   []string `json:"tools"`
	Approve bool     `json:"approve,omitempty"`
}

// ToolLimits bound a run's tool calls (config "tool_limits"); zero values
// take the defaults below.
type ToolLimits struct {
	Calls         int      `json:"calls,omitempty"`          // calls per run
	Concurrent    int      `json:"concurrent,omitempty"`     // calls at once per run
	ArgumentBytes Size     `json:"argument_bytes,omitempty"` // a call's arguments, as JSON
	ResultBytes   Size     `json:"result_bytes,omitempty"`   // a call's result, as JSON
	CallTimeout   Duration `json:"call_timeout,omitempty"`   // a call, approval wait excluded
}

// Defaults and bounds of tools and tool_limits.
const (
	MaxTools              = 32
	DefaultToolCalls      = 100
	DefaultToolConcurrent = 4
	DefaultToolArgBytes   = 64 << 10
	DefaultToolResBytes   = 1 << 20
	DefaultToolTimeout    = "60s"
)

// Bounds of a tool server's config and of tool_limits.
const (
	MaxToolEnv     = 64
	MaxToolCommand = 64
	MaxToolAllow   = 256 // entries of a stdio server's allow
	// MaxToolCalls .. MaxToolTimeout bound tool_limits.
	MaxToolCalls      = 10000
	MaxToolConcurrent = 64
	MaxToolArgBytes   = 16 << 20
	MaxToolResBytes   = 64 << 20
	MinToolBytes      = 1 << 10
	MaxToolTimeout    = time.Hour
)

// validateTools checks the config's tools and tool_limits.
func (c *Config) validateTools() error {
	if len(c.Tools) > MaxServices {
		return fieldErr("tools", fmt.Errorf("%d tool servers, more than the maximum %d", len(c.Tools), MaxServices))
	}
	for _, name := range sortedKeys(c.Tools) {
		if err := checkToolServer(name, c.Tools[name]); err != nil {
			return err
		}
	}
	return c.ToolLimits.validate()
}

// checkToolServer checks tools[name]; its errors name the field.
func checkToolServer(name string, s ToolServer) error {
	field := fmt.Sprintf("tools[%q]", name)
	if !isServiceName(name) {
		return fieldErr(field, errors.New("a tool server's name is 1 to 63 characters of a-z 0-9 _ -, starting with a letter or digit"))
	}
	switch {
	case len(s.Command) > 0 && s.URL != "":
		return fieldErr(field, errors.New("both command and url: a tool server is one of a stdio command or a streamable-HTTP url"))
	case len(s.Command) > 0:
		if err := s.checkStdio(field); err != nil {
			return err
		}
	case s.URL != "":
		if err := s.checkHTTP(field); err != nil {
			return err
		}
	default:
		return fieldErr(field, errors.New("neither command nor url: a tool server is one of a stdio command or a streamable-HTTP url"))
	}
	if len(s.Rules) > MaxRules {
		return fieldErr(field+".rules", fmt.Errorf("%d rules, more than the maximum %d", len(s.Rules), MaxRules))
	}
	for i, r := range s.Rules {
		if err := r.check(); err != nil {
			return fieldErr(fmt.Sprintf("%s.rules[%d].tools", field, i), err)
		}
	}
	return nil
}

// checkStdio checks the fields of a stdio server, and that no field of an
// HTTP one is set.
func (s ToolServer) checkStdio(field string) error {
	if len(s.Headers) > 0 {
		return fieldErr(field+".headers", errors.New("headers are sent to a url; a stdio server gets env"))
	}
	if len(s.Command) > MaxToolCommand {
		return fieldErr(field+".command", fmt.Errorf("%d arguments, more than the maximum %d", len(s.Command), MaxToolCommand))
	}
	if !isCleanAbs(s.Command[0]) {
		return fieldErr(field+".command[0]", fmt.Errorf("%q is not a clean absolute path", s.Command[0]))
	}
	for i, a := range s.Command {
		if strings.ContainsRune(a, 0) {
			return fieldErr(fmt.Sprintf("%s.command[%d]", field, i), errors.New("contains NUL"))
		}
	}
	if len(s.Env) > MaxToolEnv {
		return fieldErr(field+".env", fmt.Errorf("%d variables, more than the maximum %d", len(s.Env), MaxToolEnv))
	}
	for _, k := range sortedKeys(s.Env) {
		if err := s.Env[k].check(k); err != nil {
			return fieldErr(fmt.Sprintf("%s.env[%q]", field, k), err)
		}
	}
	if _, _, err := ParseToolUser(s.User); err != nil {
		return fieldErr(field+".user", err)
	}
	if len(s.Allow) > MaxToolAllow {
		return fieldErr(field+".allow", fmt.Errorf("%d entries, more than the maximum %d", len(s.Allow), MaxToolAllow))
	}
	for i, e := range s.Allow {
		if _, err := netpolicy.CanonicalAllow(e); err != nil {
			return fieldErr(fmt.Sprintf("%s.allow[%d]", field, i), fmt.Errorf("%q: %w", e, err))
		}
	}
	return nil
}

// checkHTTP checks the fields of a streamable-HTTP server, and that no
// field of a stdio one is set.
func (s ToolServer) checkHTTP(field string) error {
	if len(s.Env) > 0 || s.User != "" || s.Shared || len(s.Allow) > 0 {
		return fieldErr(field, errors.New("env, user, allow and shared are a stdio command's; a url's server runs elsewhere"))
	}
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return fieldErr(field+".url", fmt.Errorf("%q is not an http or https URL with a host (and no user or fragment)", s.URL))
	}
	if len(s.Headers) > MaxInject {
		return fieldErr(field+".headers", fmt.Errorf("%d headers, more than the maximum %d", len(s.Headers), MaxInject))
	}
	for _, h := range sortedKeys(s.Headers) {
		f := fmt.Sprintf("%s.headers[%q]", field, h)
		if err := checkToolHeader(h); err != nil {
			return fieldErr(f, err)
		}
		if in := s.Headers[h]; !isCleanAbs(in.File) {
			return fieldErr(f+".file", fmt.Errorf("%q is not a clean absolute path", in.File))
		} else if err := checkLine(in.Prefix); err != nil {
			return fieldErr(f+".prefix", err)
		}
	}
	return nil
}

// checkToolHeader refuses a header a service could not inject, and those
// the MCP client itself sets.
func checkToolHeader(h string) error {
	if err := netpolicy.CheckHeaderName(h); err != nil {
		return err
	}
	for _, own := range []string{"Accept", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID"} {
		if strings.EqualFold(h, own) {
			return fmt.Errorf("%q is set by the MCP client", h)
		}
	}
	return nil
}

// checkLine refuses a value with a control character other than a tab.
func checkLine(v string) error {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return errors.New("holds a control character")
		}
	}
	return nil
}

// check checks the environment variable name's value: exactly one of
// value or file (then prefix may come before the file's content).
func (v ToolValue) check(name string) error {
	if !isEnvName(name) || len(name) > 256 {
		return errors.New("not an environment variable name ([A-Za-z_][A-Za-z0-9_]*, at most 256)")
	}
	switch {
	case v.File != "" && v.Value != "":
		return errors.New("both value and file: give one")
	case v.File != "":
		if !isCleanAbs(v.File) {
			return fieldErr("file", fmt.Errorf("%q is not a clean absolute path", v.File))
		}
	case v.Prefix != "":
		return errors.New("prefix without file: prefix comes before a file's content")
	}
	for _, s := range []string{v.Value, v.Prefix} {
		if strings.ContainsRune(s, 0) || len(s) > 4096 {
			return errors.New("a value or prefix holds NUL or is longer than 4096 bytes")
		}
	}
	return nil
}

// check checks a rule's globs: 1 to MaxRules of path.Match's syntax.
func (r ToolRule) check() error {
	if len(r.Tools) == 0 || len(r.Tools) > MaxRules {
		return fmt.Errorf("%d globs: want 1 to %d", len(r.Tools), MaxRules)
	}
	for i, g := range r.Tools {
		if _, err := path.Match(g, ""); err != nil || g == "" || len(g) > 256 {
			return fmt.Errorf("[%d] %q is not a glob of tool names (path.Match syntax, 1 to 256 bytes)", i, g)
		}
	}
	return nil
}

// NobodyID is the user and group a stdio tool server runs as by default.
const NobodyID = 65534

// ParseToolUser reads a stdio tool server's user: "" is nobody
// (65534:65534), "uid:gid" numbers, never 0; a name (of the host's passwd,
// resolved by the broker) gives name and zero ids.
func ParseToolUser(u string) (name string, ids [2]uint32, err error) {
	if u == "" {
		return "", [2]uint32{NobodyID, NobodyID}, nil
	}
	if uid, gid, ok := strings.Cut(u, ":"); ok {
		for i, s := range []string{uid, gid} {
			n, err := strconv.ParseUint(s, 10, 32)
			if err != nil || n == 0 || n == math.MaxUint32 {
				return "", ids, fmt.Errorf("%q: want \"uid:gid\", numbers from 1 to %d (never root's 0)", u, uint32(math.MaxUint32-1))
			}
			ids[i] = uint32(n)
		}
		return "", ids, nil
	}
	if !isName(u, 1, 32, "._-") || u[0] == '-' {
		return "", ids, fmt.Errorf("%q: want a user name of the host (1 to 32 of A-Z a-z 0-9 . _ -), \"uid:gid\" or \"\" (nobody)", u)
	}
	if u == "root" {
		return "", ids, errors.New("\"root\": a tool server never runs as root")
	}
	return u, ids, nil
}

// validate checks tool_limits: each unset (the default) or within bounds.
func (l ToolLimits) validate() error {
	ints := []struct {
		name   string
		v, max int
	}{{"calls", l.Calls, MaxToolCalls}, {"concurrent", l.Concurrent, MaxToolConcurrent}}
	for _, f := range ints {
		if f.v < 0 || f.v > f.max {
			return fieldErr("tool_limits."+f.name, fmt.Errorf("%d: want 1 to %d (0 or absent: the default)", f.v, f.max))
		}
	}
	sizes := []struct {
		name string
		v    Size
		max  int64
	}{{"argument_bytes", l.ArgumentBytes, MaxToolArgBytes}, {"result_bytes", l.ResultBytes, MaxToolResBytes}}
	for _, f := range sizes {
		if f.v.IsSet() && (f.v.Bytes() < MinToolBytes || f.v.Bytes() > f.max) {
			return fieldErr("tool_limits."+f.name, fmt.Errorf("%q: want a size from 1k to %dm", f.v, f.max>>20))
		}
	}
	if d := l.CallTimeout; d.IsSet() && (d.Duration() < time.Second || d.Duration() > MaxToolTimeout) {
		return fieldErr("tool_limits.call_timeout", fmt.Errorf("%q: want a duration from 1s to 1h", d))
	}
	return nil
}

// Effective is l with the defaults in place of unset values.
func (l ToolLimits) Effective() (calls, concurrent int, argBytes, resBytes int64, timeout time.Duration) {
	calls, concurrent = cmp.Or(l.Calls, DefaultToolCalls), cmp.Or(l.Concurrent, DefaultToolConcurrent)
	argBytes, resBytes = cmp.Or(l.ArgumentBytes.Bytes(), DefaultToolArgBytes), cmp.Or(l.ResultBytes.Bytes(), DefaultToolResBytes)
	timeout = cmp.Or(l.CallTimeout.Duration(), MustDuration(DefaultToolTimeout).Duration())
	return calls, concurrent, argBytes, resBytes, timeout
}
