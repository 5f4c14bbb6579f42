package config

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
	// User is the user the stdio server runs as: a name of the host's
	// passwd or "uid:gid"; "" means nobody (65534:65534). Never root.
	User string `json:"user,omitempty"`
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
