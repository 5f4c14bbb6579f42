package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"

	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/uidrange"
)

// Policy holds the maxima a task may ask for, in the same syntax as the
// limits. A task asking for more is refused, never clamped.
type Policy struct {
	Limits
	AllowNetwork *bool `json:"allow_network"` // false: tasks may not ask for any network
	// LocalImages are the directories under which a task may name a local
	// image (dir:, oci:, docker-archive:); none by default. The config's
	// own default image is the operator's and is not bound by it.
	LocalImages []string `json:"local_images,omitempty"`
	// Registries are the registries ("host", "host:port") a task may name
	// an image from; none by default. The config's own images (image, and
	// server.pool's) and what the store already holds need no entry. A
	// pull for a task never connects to a loopback, private, link-local
	// or other non-global address of a host not listed here.
	Registries []endpoint.Registry `json:"registries,omitempty"`
}

// Network configures the egress proxy: static host entries (name to IP, used
// instead of DNS) and address ranges allowed or denied beyond the built-in
// refusal of loopback, private, link-local and similar addresses.
type Network struct {
	Hosts       map[string]netip.Addr `json:"hosts"`
	AllowRanges []netip.Prefix        `json:"allow_ranges"`
	DenyRanges  []netip.Prefix        `json:"deny_ranges"`
	// HostPorts are the host's own addresses and ports ("127.0.0.1:4222")
	// that sandboxes may reach through the proxy; every other address of
	// the host (loopback, any interface's) is refused whatever the ranges.
	HostPorts []netip.AddrPort `json:"host_ports"`
	// CAFiles are PEM files of extra roots that services' upstreams are
	// verified against, beside the host's.
	CAFiles []string `json:"ca_files"`
	// Services are the hosts a task may ask for by name in its
	// network.services: the proxy answers them itself, lets through only
	// what their rules allow and injects their credentials.
	Services map[string]Service `json:"services"`
	// ApprovalTimeout is how long a request held by an approve rule waits
	// for a decision before it is denied.
	ApprovalTimeout Duration `json:"approval_timeout"`

	// services are Services as the proxy takes them, validated: set by
	// Validate (which Load and Parse call), nil before.
	services map[string]*netpolicy.Service
}

// ProxyService returns the service name of network.services as the proxy
// takes it, converted and validated once when the config was validated
// (Validate, which Load and Parse call), and false if there is none: no
// such service, or a config not validated since the service was added.
// The value is shared by every run of the config: it is never changed.
func (n *Network) ProxyService(name string) (*netpolicy.Service, bool) {
	s, ok := n.services[name]
	return s, ok
}

// Service is one service of network.services (see netpolicy.Service).
type Service struct {
	URL    string            `json:"url"`    // https://host[:port] or http://host[:port]
	Inject map[string]Inject `json:"inject"` // header name -> where its value comes from
	Rules  []ServiceRule     `json:"rules"`
}

// Inject is an injected header's value: Prefix then the content of File,
// a root-only file read at each request.
type Inject struct {
	Prefix string `json:"prefix"`
	File   string `json:"file"`
}

// ServiceRule lets through requests with one of Methods ("*" any) to a
// path matching one of Paths ("*" within a segment, "**" any segments);
// with Approve, only once a human approves.
type ServiceRule struct {
	Methods []string `json:"methods"`
	Paths   []string `json:"paths"`
	Approve bool     `json:"approve"`
}

// Runsc locates gVisor's runsc and the flags it is always given.
type Runsc struct {
	Path  string   `json:"path"`
	Flags []string `json:"flags"`
}

// Server configures `agentrun serve`.
type Server struct {
	Listen        Addr                 `json:"listen"`         // unix:///abs/path or tcp://host:port
	MaxConcurrent int                  `json:"max_concurrent"` // runs at once, >= 1
	Queue         int                  `json:"queue"`          // runs waiting for a slot, >= 0
	Quota         Quota                `json:"quota"`
	Pool          map[string]PoolEntry `json:"pool"` // image -> sandboxes kept ready
	Token         string               `json:"token,omitempty"`
	Approvals     Approvals            `json:"approvals"`
	// Hosts are more names (or IP addresses) a request's Host and Origin
	// may give the server, besides localhost, loopback addresses, the
	// listen address and, on a unix socket, "agentrun": the names it is
	// reached by through a reverse proxy or from another machine.
	Hosts []string `json:"hosts"`
	// PreviewDomain, when set, is a domain whose names PORT-ID (a live
	// sandbox's port and id) serve answers to, as the sandbox's ports
	// (/v1/sandboxes/ID/ports/PORT): the operator points a wildcard
	// name at serve.
	PreviewDomain string `json:"preview_domain,omitempty"`
}

// Approvals configures how serve asks a human about requests held for
// approval when no client watches the run's stream: the webhook it
// announces them to, and its approvals page (GET /ui/approvals). With
// either, such a request waits for a decision (the API, the page) until
// network.approval_timeout; with neither, it is denied at once.
type Approvals struct {
	Webhook           string `json:"webhook"`             // http(s) URL of the operator's own receiver; "" none
	WebhookSecretFile string `json:"webhook_secret_file"` // root-only file of the HMAC-SHA256 key, required with webhook
	Page              bool   `json:"page"`                // serve GET /ui/approvals
}

// WorkerApprovals configures how a worker asks about its requests held
// for approval: it announces them to the webhook and takes decisions on
// SUBJECT.ID over NATS (`agentrun approve`). Without a webhook they are
// denied at once.
type WorkerApprovals struct {
	Webhook           string `json:"webhook"`
	WebhookSecretFile string `json:"webhook_secret_file"`
	Subject           string `json:"subject"` // prefix of the decisions' subjects
}

// PoolEntry is one image's entry of server.pool: how many sandboxes are
// kept ready for it and, with Warm, that they are warm ones. In JSON it is
// a count, or {"count", "warm"}.
type PoolEntry struct {
	Count int   `json:"count"`
	Warm  *Warm `json:"warm,omitempty"`
}

// Warm makes a pool's sandboxes warm: the interpreter of Language is
// started in each, under every restriction of the sandbox, with Preload
// imported, and waits for the one task that takes it.
type Warm struct {
	Language string   `json:"language"` // a language of the config whose interpreter is python
	Preload  []string `json:"preload"`  // modules imported ahead, in order
}

// UnmarshalJSON reads a count or an object (DecodeStrict has checked its
// keys).
func (e *PoolEntry) UnmarshalJSON(data []byte) error {
	var n int
	if err := json.Unmarshal(data, &n); err == nil {
		*e = PoolEntry{Count: n}
		return nil
	}
	type plain PoolEntry
	return json.Unmarshal(data, (*plain)(e))
}

// MarshalJSON writes an entry without warm as its count, as it is read.
func (e PoolEntry) MarshalJSON() ([]byte, error) {
	if e.Warm == nil {
		return json.Marshal(e.Count)
	}
	type plain PoolEntry
	return json.Marshal(plain(e))
}

// PoolSizes is server.pool's count per image.
func (s *Server) PoolSizes() map[string]int {
	sizes := make(map[string]int, len(s.Pool))
	for ref, e := range s.Pool {
		sizes[ref] = e.Count
	}
	return sizes
}

// PoolWarm is server.pool's warm settings, per image that has them.
func (s *Server) PoolWarm() map[string]Warm {
	warm := map[string]Warm{}
	for ref, e := range s.Pool {
		if e.Warm != nil {
			warm[ref] = *e.Warm
		}
	}
	return warm
}

// NeedsToken says whether a socket of network ("tcp" or "unix", as
// server.listen spells it) lacks the server.token that every request on
// a TCP socket must carry: the API is never open to the network without
// one.
func (s *Server) NeedsToken(network string) bool {
	return network == "tcp" && s.Token == ""
}

// Worker configures `agentrun worker`, which takes tasks from a NATS
// JetStream work-queue stream and stores their results in a KV bucket, and
// the clients `agentrun submit` and `agentrun result`.
type Worker struct {
	NATS       []string  `json:"nats"`        // server URLs (nats:// or tls://)
	Creds      string    `json:"creds"`       // NATS credentials file (JWT and nkey seed), absolute; "" none
	TLS        WorkerTLS `json:"tls"`         // client TLS
	Stream     string    `json:"stream"`      // work-queue stream of tasks
	Subject    string    `json:"subject"`     // subject tasks are published on
	Results    string    `json:"results"`     // KV bucket of results, keyed by task id
	Events     string    `json:"events"`      // subject prefix of live output (PREFIX.ID); "" none
	Slots      int       `json:"slots"`       // tasks at once per worker; 0: server.max_concurrent
	AckWait    Duration  `json:"ack_wait"`    // redelivery after silence this long (a running task is kept alive)
	MaxDeliver int       `json:"max_deliver"` // deliveries of a task before its result is an error
	RetryDelay Duration  `json:"retry_delay"` // a host failure naks with this delay times the delivery count
	Replicas   int       `json:"replicas"`    // replicas of the stream and the bucket when a worker creates them
	ResultTTL  Duration  `json:"result_ttl"`  // how long results are kept
	// Approvals: the webhook of held requests, and where decisions come.
	Approvals WorkerApprovals `json:"approvals"`
}

// WorkerTLS names the PEM files of a TLS connection to NATS; all optional,
// cert and key together.
type WorkerTLS struct {
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// Quota bounds each session; 0 disables that bound.
type Quota struct {
	RunsPerMinute int `json:"runs_per_minute"`
	Concurrent    int `json:"concurrent"`
}

// Sessions configures kept session workspaces (docs/sessions.md): each
// is a disk image of MaxBytes, removed after TTL idle.
type Sessions struct {
	TTL      Duration `json:"ttl"`       // idle time after which gc removes a session
	Max      int      `json:"max"`       // sessions on this host at once
	MaxBytes Size     `json:"max_bytes"` // size cap of each session's /workspace
	// StateMaxBytes caps a session's saved state (keep_state): a state
	// past it is not kept, and the previous one stays. Unset, it is
	// DefaultStateBytes or MaxBytes, the smaller (StateBytes).
	StateMaxBytes Size `json:"state_max_bytes"`
}

// DefaultStateBytes is sessions.state_max_bytes when the config sets none.
const DefaultStateBytes = 64 << 20

// StateBytes is the cap on a session's saved state.
func (s Sessions) StateBytes() int64 {
	if n := s.StateMaxBytes.Bytes(); n > 0 {
		return n
	}
	return min(DefaultStateBytes, s.MaxBytes.Bytes())
}

// Sandboxes bounds serve's live sandboxes (docs/sandboxes.md): how long
// one lives unless its creation asks otherwise, the most it may live
// from its creation, and how many live at once.
type Sandboxes struct {
	DefaultTimeout Duration `json:"default_timeout"`
	MaxLifetime    Duration `json:"max_lifetime"`
	Max            int      `json:"max"`
}

// RunUIDs is the range of host ids that sandboxes run as: each sandbox
// takes one id, as its uid and gid, for its whole life, so that the
// kernel's per-user limits are its own. No host user or group may hold
// an id of the range. Dir is where the ids are reserved: one dir for every
// agentrun of the host, whatever its state dir (uidrange.DefaultDir), so
// that two of them never give one id to two sandboxes; another dir suits
// only a range no other agentrun of the host uses (a test suite's).
type RunUIDs struct {
	First int64  `json:"first"`
	Count int64  `json:"count"`
	Dir   string `json:"dir"`
}

// ReservationsDir is where the ids are reserved: Dir, or
// uidrange.DefaultDir when Dir is "".
func (r RunUIDs) ReservationsDir() string {
	if r.Dir == "" {
		return uidrange.DefaultDir
	}
	return r.Dir
}

// Config is agentrun's host configuration. Image, Language, Limits, Env and
// Runtime are defaults for tasks; the rest configures the host side.
type Config struct {
	Image     string              `json:"image"`
	Language  string              `json:"language"`
	Limits    Limits              `json:"limits"`
	Env       map[string]string   `json:"env"`
	Runtime   string              `json:"runtime"`
	Policy    Policy              `json:"policy"`
	Languages map[string][]string `json:"languages"` // language -> argv; "{file}" is replaced by the code file's path
	Network   Network             `json:"network"`
	// Tools are the MCP tool servers a task may name (spec §13), and
	// ToolLimits the bounds of a run's calls to them.
	Tools      Tools      `json:"tools"`
	ToolLimits ToolLimits `json:"tool_limits"`
	Runsc      Runsc      `json:"runsc"`
	Init       string     `json:"init"` // the sandbox's init: a static binary (tini-static)
	// SeccompHelper is agentrun-seccomp, which loads a libcontainer
	// sandbox's seccomp filter compiled once per process instead of in
	// each container's init; "" looks beside the agentrun binary, then in
	// ../lib/agentrun from it, and without one libcontainer compiles it;
	// "off" has libcontainer compile it in each init, as runc does.
	SeccompHelper string    `json:"seccomp_helper"`
	Server        Server    `json:"server"`
	Worker        Worker    `json:"worker"`
	Sessions      Sessions  `json:"sessions"`
	Sandboxes     Sandboxes `json:"sandboxes"`
	// E2B is serve's E2B door (spec §18).
	E2B      E2B    `json:"e2b"`
	StoreDir string `json:"store_dir"`
	StoreMax Size   `json:"store_max_size"` // size cap of the image store; least recently used images go first
	StateDir string `json:"state_dir"`
	// CgroupParent is the cgroup under which libcontainer runs' cgroups
	// are made, in every hierarchy; runsc runs' go under the same path
	// with "-runsc" appended (RunscCgroupParent). Two agentruns on one
	// host each need their own, as they need their own state_dir.
	CgroupParent string  `json:"cgroup_parent"`
	RunUIDs      RunUIDs `json:"run_uids"` // the host ids sandboxes run as, one per sandbox
	Audit        string  `json:"audit"`    // absolute path, "-" for stderr, "" for none
}

// DefaultInit is the sandbox's init unless the config names another:
// Debian's tini-static (package tini).
const DefaultInit = "/usr/bin/tini-static"

// SeccompHelperOff is the seccomp_helper that has libcontainer compile
// each sandbox's filter in its init.
const SeccompHelperOff = "off"

// DefaultCgroupParent is the cgroup_parent unless the config names
// another.
const DefaultCgroupParent = "/agentrun"

// RunscCgroupParent is the cgroup under which runsc runs' cgroups are
// made: cgroup_parent with "-runsc" appended.
func (c *Config) RunscCgroupParent() string { return c.CgroupParent + "-runsc" }

// DefaultPath is where Load looks when given no path.
const DefaultPath = "/etc/agentrun/config.json"

// MaxFileBytes caps the size of a config file.
const MaxFileBytes = 1 << 20

// Runtime names.
const (
	RuntimeLibcontainer = "libcontainer"
	RuntimeRunsc        = "runsc"
)

func ptr[T any](v T) *T { return &v }

// Default returns the built-in configuration, which mirrors the seed's
// docker flags. Each call returns a fresh value.
func Default() *Config {
	limits, maxima := defaultLimits()
	return &Config{
		Image:    "python:3.12-slim",
		Language: "python",
		Limits:   limits,
		Env:      map[string]string{},
		Runtime:  RuntimeLibcontainer,
		Policy:   Policy{Limits: maxima, AllowNetwork: ptr(true)},
		Languages: map[string][]string{
			"python":  {"python3", "-u", "{file}"},
			"python3": {"python3", "-u", "{file}"},
			"node":    {"node", "{file}"},
			"bash":    {"bash", "{file}"},
			"sh":      {"sh", "{file}"},
		},
		Network: Network{Hosts: map[string]netip.Addr{}, AllowRanges: []netip.Prefix{}, DenyRanges: []netip.Prefix{},
			HostPorts: []netip.AddrPort{}, CAFiles: []string{}, Services: map[string]Service{}, ApprovalTimeout: MustDuration("60s")},
		Runsc: Runsc{Path: "/usr/local/bin/runsc", Flags: []string{"--platform=systrap"}},
		Init:  DefaultInit,
		Server: Server{
			Listen:        MustAddr("unix:///run/agentrun/agentrun.sock"),
			MaxConcurrent: 8,
			Queue:         64,
			Quota:         Quota{RunsPerMinute: 60, Concurrent: 2},
			Pool:          map[string]PoolEntry{},
		},
		Worker: Worker{
			NATS:   []string{"nats://127.0.0.1:4222"},
			Stream: "AGENTRUN", Subject: "agentrun.tasks", Results: "agentrun-results", Events: "agentrun.events",
			AckWait: MustDuration("30s"), MaxDeliver: 3, RetryDelay: MustDuration("5s"), Replicas: 1, ResultTTL: MustDuration("24h"),
			Approvals: WorkerApprovals{Subject: "agentrun.approvals"},
		},
		Sessions:  Sessions{TTL: MustDuration("1h"), Max: 1000, MaxBytes: MustSize("256m")},
		Sandboxes: Sandboxes{DefaultTimeout: MustDuration("5m"), MaxLifetime: MustDuration("1h"), Max: 64},
		StoreDir:  "/var/lib/agentrun",
		StoreMax:  MustSize("20g"),
		// Under /run/agentrun, which holds the socket and which the
		// agentrun group may enter; the state dir itself is root's alone.
		StateDir:     "/run/agentrun/state",
		CgroupParent: DefaultCgroupParent,
		RunUIDs:      RunUIDs{First: uidrange.DefaultFirst, Count: uidrange.DefaultCount, Dir: uidrange.DefaultDir},
		Audit:        "/var/log/agentrun/audit.jsonl",
	}
}

// Load reads the config file at path ("" means DefaultPath), merges it over
// Default() and validates the result. A missing DefaultPath gives Default();
// a missing explicitly named file is an error.
func Load(path string) (*Config, error) {
	if path == "" {
		return load(DefaultPath, true)
	}
	return load(path, false)
}

// load reads and parses the file at path; missingOK makes a missing file
// give Default().
func load(path string, missingOK bool) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		if missingOK && errors.Is(err, fs.ErrNotExist) {
			return Default(), nil
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("config %s: larger than %d bytes", path, MaxFileBytes)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// Parse merges the JSON config document data over Default() and validates
// the result. Keys present override; maps (languages, env, hosts, pool) merge
// per key, and a language set to null is removed; limits and policy merge per
// field.
func Parse(data []byte) (*Config, error) {
	c := Default()
	if err := DecodeStrict(data, c); err != nil {
		return nil, err
	}
	for name, argv := range c.Languages {
		if argv == nil {
			delete(c.Languages, name)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ToolsCgroupParent is the cgroup under which the stdio tool servers'
// cgroups are made: cgroup_parent with "-tools" appended.
func (c *Config) ToolsCgroupParent() string { return c.CgroupParent + "-tools" }
