package config

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/uidrange"
)

// Validate checks every value of c and returns the first problem found,
// prefixed with the key path ("limits.memory: ...").
func (c *Config) Validate() error {
	if err := CheckImage(c.Image); err != nil {
		return fieldErr("image", err)
	}
	if c.Language != "" && c.Languages[c.Language] == nil {
		return fieldErr("language", fmt.Errorf("%q is not in languages (known: %s)", c.Language, strings.Join(LanguageNames(c), ", ")))
	}
	if err := CheckRuntime(c.Runtime); err != nil {
		return fieldErr("runtime", err)
	}
	if err := validateLimits(c.Limits, c.Policy); err != nil {
		return err
	}
	for _, name := range sortedKeys(c.Env) {
		if err := CheckEnv(name, c.Env[name]); err != nil {
			return fieldErr(fmt.Sprintf("env[%q]", name), err)
		}
	}
	for _, name := range sortedKeys(c.Languages) {
		if err := checkLanguage(name, c.Languages[name]); err != nil {
			return fieldErr(fmt.Sprintf("languages[%q]", name), err)
		}
	}
	if err := c.Network.validate(); err != nil {
		return err
	}
	if err := c.validateTools(); err != nil {
		return err
	}
	if err := c.Runsc.validate(c.Runtime); err != nil {
		return err
	}
	if err := c.Server.validate(); err != nil {
		return err
	}
	if err := c.validateWarm(); err != nil {
		return err
	}
	if err := c.Worker.validate(); err != nil {
		return err
	}
	if !isCleanAbs(c.Init) {
		return fieldErr("init", fmt.Errorf("%q is not a clean absolute path (the sandbox's init, e.g. %s)", c.Init, DefaultInit))
	}
	if c.SeccompHelper != "" && c.SeccompHelper != SeccompHelperOff && !isCleanAbs(c.SeccompHelper) {
		return fieldErr("seccomp_helper", fmt.Errorf("%q is not a clean absolute path (agentrun-seccomp), \"\" (look for it) or %q", c.SeccompHelper, SeccompHelperOff))
	}
	if err := c.Sessions.validate(); err != nil {
		return err
	}
	if err := c.Sandboxes.validate(); err != nil {
		return err
	}
	if err := c.E2B.validate(c.Server.PreviewDomain); err != nil {
		return err
	}
	for _, d := range []struct{ name, path string }{{"store_dir", c.StoreDir}, {"state_dir", c.StateDir}} {
		if !isCleanAbs(d.path) {
			return fieldErr(d.name, fmt.Errorf("%q is not a clean absolute path", d.path))
		}
	}
	if err := checkCgroupParent(c.CgroupParent); err != nil {
		return fieldErr("cgroup_parent", err)
	}
	if err := uidrange.Check(c.RunUIDs.First, c.RunUIDs.Count); err != nil {
		return fieldErr("run_uids", err)
	}
	if c.RunUIDs.Dir != "" && !isCleanAbs(c.RunUIDs.Dir) {
		return fieldErr("run_uids.dir", fmt.Errorf("%q is not a clean absolute path (where every agentrun of the host reserves ids, %s)", c.RunUIDs.Dir, uidrange.DefaultDir))
	}
	if c.StoreMax.Bytes() <= 0 {
		return fieldErr("store_max_size", fmt.Errorf("%q: want a size such as \"20g\"", c.StoreMax))
	}
	if c.Audit != "" && c.Audit != "-" && !isCleanAbs(c.Audit) {
		return fieldErr("audit", fmt.Errorf("%q is not an absolute path, \"-\" (stderr) or \"\" (off)", c.Audit))
	}
	return nil
}

// checkCgroupParent accepts a clean absolute cgroup path other than the
// root, of letters, digits and "._-", at most 200 bytes.
func checkCgroupParent(p string) error {
	if !isCleanAbs(p) || p == "/" || len(p) > 200 {
		return fmt.Errorf("%q is not a clean absolute cgroup path below the root, such as %s", p, DefaultCgroupParent)
	}
	for _, r := range p {
		if !(r == '/' || r == '.' || r == '_' || r == '-' || r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r))) {
			return fmt.Errorf("%q: only letters, digits, \"/\", \".\", \"_\" and \"-\" may name a cgroup here", p)
		}
	}
	return nil
}

// LanguageNames returns the configured language names, sorted.
func LanguageNames(c *Config) []string { return sortedKeys(c.Languages) }

func fieldErr(field string, err error) error { return fmt.Errorf("%s: %w", field, err) }

// validateLimits checks that every policy maximum is present and above
// zero, every default too and within policy (the check a task's limits
// get, by Limits.pick), and the rest of the policy.
func validateLimits(l Limits, p Policy) error {
	if err := p.checkMaxima(); err != nil {
		return err
	}
	if _, err := (Limits{}).pick(l, p.Limits); err != nil {
		return err
	}
	for i, d := range p.LocalImages {
		if !isCleanAbs(d) {
			return fmt.Errorf("policy.local_images[%d]: %q must be an absolute, clean path", i, d)
		}
	}
	if p.AllowNetwork == nil {
		return fieldErr("policy.allow_network", errors.New("required"))
	}
	return nil
}

func checkLanguage(name string, argv []string) error {
	if !isLanguageName(name) {
		return errors.New("language name must be 1-64 characters of A-Z a-z 0-9 . _ + -")
	}
	if len(argv) == 0 {
		return errors.New("argv is empty")
	}
	for i, a := range argv {
		if a == "" || strings.ContainsRune(a, 0) {
			return fmt.Errorf("argv[%d] is empty or contains NUL", i)
		}
	}
	return nil
}

// validate checks n and, once all of it is good, keeps the proxy's form
// of its services (ProxyService).
func (n *Network) validate() error {
	for _, host := range sortedKeys(n.Hosts) {
		field := fmt.Sprintf("network.hosts[%q]", host)
		if err := netpolicy.CheckHostname(host); err != nil {
			return fieldErr(field, err)
		}
		if !n.Hosts[host].IsValid() {
			return fieldErr(field, errors.New("not an IP address"))
		}
	}
	if len(n.CAFiles) > MaxCAFiles {
		return fieldErr("network.ca_files", fmt.Errorf("%d files, more than the maximum %d", len(n.CAFiles), MaxCAFiles))
	}
	for i, f := range n.CAFiles {
		if !isCleanAbs(f) {
			return fieldErr(fmt.Sprintf("network.ca_files[%d]", i), fmt.Errorf("%q is not a clean absolute path", f))
		}
	}
	if d := n.ApprovalTimeout.Duration(); d < time.Second || d > time.Hour {
		return fieldErr("network.approval_timeout", fmt.Errorf("%q: want a duration from 1s to 1h", n.ApprovalTimeout))
	}
	services, err := n.checkServices()
	if err != nil {
		return err
	}
	for _, list := range []struct {
		name   string
		ranges []netip.Prefix
	}{{"allow_ranges", n.AllowRanges}, {"deny_ranges", n.DenyRanges}} {
		for i, r := range list.ranges {
			if !r.IsValid() { // null: the decoder has checked the rest
				return fieldErr(fmt.Sprintf("network.%s[%d]", list.name, i), errors.New("null is not a CIDR range (e.g. 10.0.0.0/8)"))
			}
		}
	}
	for i, hp := range n.HostPorts {
		if err := checkHostPort(hp); err != nil {
			return fieldErr(fmt.Sprintf("network.host_ports[%d]", i), err)
		}
	}
	n.services = services
	return nil
}

// checkServices checks network.services and returns each as the proxy
// takes it, validated (netpolicy.Service.Validate); nil when there are
// none.
func (n *Network) checkServices() (map[string]*netpolicy.Service, error) {
	if len(n.Services) == 0 {
		return nil, nil
	}
	if len(n.Services) > MaxServices {
		return nil, fieldErr("network.services", fmt.Errorf("%d services, more than the maximum %d", len(n.Services), MaxServices))
	}
	at := map[string]string{}
	out := make(map[string]*netpolicy.Service, len(n.Services))
	for _, name := range sortedKeys(n.Services) {
		field := fmt.Sprintf("network.services[%q]", name)
		if !isServiceName(name) {
			return nil, fieldErr(field, errors.New("a service name is 1 to 63 characters of a-z 0-9 _ -, starting with a letter or digit"))
		}
		s := n.Services[name]
		if len(s.Inject) > MaxInject || len(s.Rules) > MaxRules {
			return nil, fieldErr(field, fmt.Errorf("more than %d inject headers or %d rules", MaxInject, MaxRules))
		}
		for h, in := range s.Inject {
			if !isCleanAbs(in.File) {
				return nil, fieldErr(fmt.Sprintf("%s.inject[%q].file", field, h), fmt.Errorf("%q is not a clean absolute path", in.File))
			}
		}
		for i, r := range s.Rules {
			if len(r.Paths) > MaxRules || len(r.Methods) > MaxRules {
				return nil, fieldErr(fmt.Sprintf("%s.rules[%d]", field, i), fmt.Errorf("more than %d methods or paths", MaxRules))
			}
		}
		ps := proxyService(name, s)
		if err := ps.Validate(); err != nil {
			return nil, fieldErr(field, err)
		}
		authority := ps.Authority()
		if other, dup := at[authority]; dup {
			return nil, fieldErr(field, fmt.Errorf("same host and port (%s) as service %q", authority, other))
		}
		at[authority] = name
		out[name] = &ps
	}
	return out, nil
}

// checkHostPort checks an entry of network.host_ports: one address (no
// zone, not unspecified) and a port other than 0.
func checkHostPort(hp netip.AddrPort) error {
	switch a := hp.Addr(); {
	case !a.IsValid(): // null: the decoder has checked the rest
		return errors.New("null is not an address and port (e.g. 127.0.0.1:4222)")
	case a.Zone() != "":
		return fmt.Errorf("%s: an address with a zone is never dialled", hp)
	case a.Unmap().IsUnspecified():
		return fmt.Errorf("%s: name one address of the host, not the unspecified address", hp)
	case hp.Port() == 0:
		return fmt.Errorf("%s: port 0 is no port", hp)
	}
	return nil
}

// Bounds of network.services and network.ca_files.
const (
	MaxServices = 64
	MaxInject   = 16
	MaxRules    = 64
	MaxCAFiles  = 16
)

// proxyService is the proxy's form of the service name of
// network.services, not yet validated.
func proxyService(name string, s Service) netpolicy.Service {
	ps := netpolicy.Service{Name: name, URL: s.URL}
	for _, h := range sortedKeys(s.Inject) {
		ps.Inject = append(ps.Inject, netpolicy.Inject{Header: h, Prefix: s.Inject[h].Prefix, File: s.Inject[h].File})
	}
	for _, r := range s.Rules {
		ps.Rules = append(ps.Rules, netpolicy.Rule{Methods: r.Methods, Paths: r.Paths, Approve: r.Approve})
	}
	return ps
}

func (r Runsc) validate(runtime string) error {
	if r.Path == "" && runtime == RuntimeRunsc {
		return fieldErr("runsc.path", errors.New("required when runtime is runsc"))
	}
	if r.Path != "" && !isCleanAbs(r.Path) {
		return fieldErr("runsc.path", fmt.Errorf("%q is not a clean absolute path", r.Path))
	}
	for i, f := range r.Flags {
		if f == "" || strings.ContainsRune(f, 0) {
			return fieldErr(fmt.Sprintf("runsc.flags[%d]", i), errors.New("empty or contains NUL"))
		}
	}
	return nil
}

func (s Server) validate() error {
	if s.Listen.Network == "" {
		return fieldErr("server.listen", errors.New("required: unix:///path/to.sock or tcp://host:port"))
	}
	if s.MaxConcurrent < 1 {
		return fieldErr("server.max_concurrent", fmt.Errorf("%d: must be at least 1", s.MaxConcurrent))
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"queue", s.Queue}, {"quota.runs_per_minute", s.Quota.RunsPerMinute}, {"quota.concurrent", s.Quota.Concurrent}} {
		if f.v < 0 {
			return fieldErr("server."+f.name, fmt.Errorf("%d: must not be negative", f.v))
		}
	}
	for _, image := range sortedKeys(s.Pool) {
		field := fmt.Sprintf("server.pool[%q]", image)
		if err := CheckImage(image); err != nil {
			return fieldErr(field, err)
		}
		if s.Pool[image].Count < 0 {
			return fieldErr(field, fmt.Errorf("%d: must not be negative", s.Pool[image].Count))
		}
	}
	if strings.ContainsFunc(s.Token, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return fieldErr("server.token", errors.New("contains whitespace or control characters"))
	}
	if len(s.Hosts) > MaxServerHosts {
		return fieldErr("server.hosts", fmt.Errorf("%d names, more than the maximum %d", len(s.Hosts), MaxServerHosts))
	}
	for i, h := range s.Hosts {
		if err := checkServerHost(h); err != nil {
			return fieldErr(fmt.Sprintf("server.hosts[%d]", i), err)
		}
	}
	if s.PreviewDomain != "" {
		if _, err := netip.ParseAddr(s.PreviewDomain); err == nil {
			return fieldErr("server.preview_domain", fmt.Errorf("%q: an IP address; want a domain name", s.PreviewDomain))
		}
		if err := netpolicy.CheckHostname(s.PreviewDomain); err != nil {
			return fieldErr("server.preview_domain", fmt.Errorf("want a domain name, without scheme, port or wildcard: %w", err))
		}
	}
	return checkWebhook("server.approvals", s.Approvals.Webhook, s.Approvals.WebhookSecretFile)
}

// MaxServerHosts bounds server.hosts.
const MaxServerHosts = 64

// checkServerHost checks an entry of server.hosts: a host name or an IP
// address alone, as a Host header names the server without its port.
func checkServerHost(h string) error {
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("%q: an IP address with a zone; want it without", h)
		}
		return nil
	}
	if err := netpolicy.CheckHostname(h); err != nil {
		return fmt.Errorf("want a host name or an IP address, without scheme, port or wildcard: %w", err)
	}
	return nil
}

// checkWebhook checks a webhook's URL and its secret file, which go
// together. The file is checked as a clean absolute path here and read
// (root's alone) when serve or a worker starts, and at each send.
func checkWebhook(field, url, secretFile string) error {
	if url == "" {
		if secretFile != "" {
			return fieldErr(field+".webhook_secret_file", errors.New("set without webhook"))
		}
		return nil
	}
	if err := endpoint.CheckWebhook(url); err != nil {
		return fieldErr(field+".webhook", err)
	}
	if !isCleanAbs(secretFile) {
		return fieldErr(field+".webhook_secret_file", fmt.Errorf("%q is not a clean absolute path (required with webhook: the key of the body's HMAC-SHA256)", secretFile))
	}
	return nil
}

// MaxPreload bounds the modules a warm pool imports ahead.
const MaxPreload = 64

// validateWarm checks server.pool's warm entries: a language of the
// config whose argv has "{file}" as an argument of its own, module names,
// and a default runtime of libcontainer (a runsc sandbox's program is
// started by runsc at its start, so it cannot be started ahead and wait).
func (c *Config) validateWarm() error {
	for _, image := range sortedKeys(c.Server.Pool) {
		w := c.Server.Pool[image].Warm
		if w == nil {
			continue
		}
		field := fmt.Sprintf("server.pool[%q].warm", image)
		argv := c.Languages[w.Language]
		if argv == nil {
			return fieldErr(field+".language", fmt.Errorf("%q is not in languages (known: %s)", w.Language, strings.Join(LanguageNames(c), ", ")))
		}
		if n := slices.Index(argv, "{file}"); n < 0 || slices.Index(argv[n+1:], "{file}") >= 0 {
			return fieldErr(field+".language", fmt.Errorf("languages[%q] must have \"{file}\" as one argument of its own, once, for a warm pool", w.Language))
		}
		if len(w.Preload) > MaxPreload {
			return fieldErr(field+".preload", fmt.Errorf("%d modules, more than %d", len(w.Preload), MaxPreload))
		}
		for i, m := range w.Preload {
			if len(m) > 255 || !isPythonModule(m) {
				return fieldErr(fmt.Sprintf("%s.preload[%d]", field, i), fmt.Errorf("%q is not a Python module name", m))
			}
		}
		if c.Runtime == RuntimeRunsc {
			return fieldErr(field, errors.New("warm pools run on libcontainer only, and runtime is runsc: runsc starts a sandbox's program as it starts the sandbox, so no interpreter can be started ahead under its restrictions and wait for a task"))
		}
	}
	return nil
}

// isCleanAbs reports whether p is an absolute, clean path without a NUL.
func isCleanAbs(p string) bool {
	return filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Bounds on a session's size: ext4 needs room for its journal and tables,
// and a session is a sandbox's working files, not a volume.
const (
	MinSessionBytes = 16 << 20
	MaxSessionBytes = 64 << 30
)

func (s Sessions) validate() error {
	if !s.TTL.IsSet() {
		return fieldErr("sessions.ttl", errors.New("required"))
	}
	if s.Max < 1 || s.Max > 100000 {
		return fieldErr("sessions.max", fmt.Errorf("%d: must be between 1 and 100000", s.Max))
	}
	if n := s.MaxBytes.Bytes(); n < MinSessionBytes || n > MaxSessionBytes {
		return fieldErr("sessions.max_bytes", fmt.Errorf("%q: must be between 16m and 64g", s.MaxBytes))
	}
	if n := s.StateMaxBytes.Bytes(); n != 0 && (n < 1<<20 || n > s.MaxBytes.Bytes()) {
		return fieldErr("sessions.state_max_bytes", fmt.Errorf("%q: must be between 1m and sessions.max_bytes (%s)", s.StateMaxBytes, s.MaxBytes))
	}
	return nil
}

// Bounds of the sandboxes section.
const (
	MaxSandboxes       = 10000
	MaxSandboxLifetime = 24 * time.Hour
)

func (s Sandboxes) validate() error {
	if !s.MaxLifetime.IsSet() || s.MaxLifetime.Duration() > MaxSandboxLifetime {
		return fieldErr("sandboxes.max_lifetime", fmt.Errorf("%q: must be above zero and at most %v", s.MaxLifetime, MaxSandboxLifetime))
	}
	if !s.DefaultTimeout.IsSet() || s.DefaultTimeout.Duration() > s.MaxLifetime.Duration() {
		return fieldErr("sandboxes.default_timeout", fmt.Errorf("%q: must be above zero and at most sandboxes.max_lifetime (%s)", s.DefaultTimeout, s.MaxLifetime))
	}
	if s.Max < 1 || s.Max > MaxSandboxes {
		return fieldErr("sandboxes.max", fmt.Errorf("%d: must be between 1 and %d", s.Max, MaxSandboxes))
	}
	return nil
}

// SessionLimits returns the sessions settings.
func (c *Config) SessionLimits() (ttl time.Duration, maxBytes int64) {
	return c.Sessions.TTL.Duration(), c.Sessions.MaxBytes.Bytes()
}
