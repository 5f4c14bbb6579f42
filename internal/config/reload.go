package config

import (
	"encoding/json"
	"reflect"
	"strings"
)

// ReloadKey is one row of ReloadTable: a key of the config (its dotted
// JSON path, "server.quota.concurrent"; a row stands for every key under
// it that no longer row names) and how a running serve takes a new
// value of it on SIGHUP.
type ReloadKey struct {
	Key string
	// Restart: only a restart of serve applies the key. A reload that
	// changes it, or any key under it, is refused as a whole, naming
	// each key changed, and the config before stays.
	Restart bool
	// Effect is where a reload's new value takes effect, or why only a
	// restart can apply it: docs/serve.md's reload table.
	Effect string
}

// ReloadTable classifies every key of the config as one a reload
// applies (to the runs admitted from then on, everywhere serve reads
// it) or one that only a restart can: each key of ConfigKeys is under a
// row, and takes the longest one it is under (a test walks the Config
// struct). Its order is docs/serve.md's table's.
var ReloadTable = []ReloadKey{
	{Key: "image", Effect: "a task's default image, and the config's own image, which `policy.registries` does not bind; `/mcp`'s description"},
	{Key: "language", Effect: "a task's default language; `/mcp`'s description"},
	{Key: "limits", Effect: "a task's default limits; the shape of the pool's sandboxes; `/mcp`'s description"},
	{Key: "env", Effect: "a task's environment"},
	{Key: "runtime", Effect: "a task's default runtime"},
	{Key: "policy", Effect: "the maxima of a task's limits, `allow_network` and `local_images`; `/mcp`'s description and schema"},
	{Key: "policy.registries", Restart: true, Effect: "the registries a task may pull from: the runner's, set up at its start"},
	{Key: "languages", Effect: "a task's languages; the warm pool's interpreters; `/mcp`'s schema"},
	{Key: "network", Restart: true, Effect: "each run's proxy, the services and their upstreams' roots: the runner's, set up at its start"},
	{Key: "tools", Effect: "the tool servers a task may name, and their commands, env, users, URLs, headers and rules (which tools are held for approval): a run takes those of the config that admitted it; a shared server whose config changed is started anew, the one before stopped once no run holds it; `/mcp`'s schema"},
	{Key: "tool_limits", Effect: "the bounds of a run's tool calls, taken as its tool servers are"},
	{Key: "runsc", Restart: true, Effect: "the runsc backend, set up at start"},
	{Key: "init", Restart: true, Effect: "the sandbox's init, staged at start"},
	{Key: "seccomp_helper", Restart: true, Effect: "the libcontainer backend's seccomp helper, checked at start"},
	{Key: "server.listen", Restart: true, Effect: "the socket, opened at start"},
	{Key: "server.max_concurrent", Effect: "runs at once (runs going on do not count against a new one)"},
	{Key: "server.queue", Effect: "runs waiting for a slot"},
	{Key: "server.quota", Effect: "each session's quotas"},
	{Key: "server.pool", Effect: "the warm pool: sandboxes of an image no longer listed, or beyond its new count, are destroyed; a new image is seeded; new warm settings replace an image's sandboxes and try warm again after a failure"},
	{Key: "server.token", Effect: "the bearer token of every request (never removed from a TCP socket)"},
	{Key: "server.approvals", Effect: "the webhook of held requests (its secret file read again, and root's) and the approvals page"},
	{Key: "server.hosts", Effect: "the names a request's Host and Origin may give"},
	{Key: "server.preview_domain", Effect: "the domain whose names PORT-ID reach live sandboxes' ports, for the requests that come next"},
	{Key: "worker", Effect: "not serve's: `agentrun worker`, `submit` and `result` read it when they start"},
	{Key: "sessions", Restart: true, Effect: "the store of kept sessions, opened at start"},
	{Key: "sandboxes", Effect: "the live sandboxes created from then on: their default timeout and max lifetime; the bound on those live at once (those already live stay, past a lower one)"},
	{Key: "e2b.templates", Effect: "the images E2B's templates name, for the E2B sandboxes created from then on"},
	{Key: "e2b.domain", Effect: "the domain whose names PORT-ID reach E2B sandboxes' ports, for the requests that come next"},
	{Key: "e2b.keys", Effect: "the E2B API keys, their files read again (and root's; a key whose file fails keeps the keys before, logged), for the E2B calls that come next: a sandbox stays its key's user's"},
	{Key: "store_dir", Restart: true, Effect: "the image store, opened at start"},
	{Key: "store_max_size", Restart: true, Effect: "the image store's cap, set at start"},
	{Key: "state_dir", Restart: true, Effect: "the runner's state, made at start"},
	{Key: "cgroup_parent", Restart: true, Effect: "the cgroups of runs and tool servers, made under it from the start, which gc finds by it"},
	{Key: "run_uids", Restart: true, Effect: "the sandboxes' host ids, reserved from the start"},
	{Key: "audit", Restart: true, Effect: "the audit log, opened at start"},
}

// ReloadOf is the row of ReloadTable that key (a key of ConfigKeys)
// takes: the longest it is under; false if it is under none.
func ReloadOf(key string) (ReloadKey, bool) {
	var best ReloadKey
	found := false
	for _, row := range ReloadTable {
		if under(key, row.Key) && (!found || len(row.Key) > len(best.Key)) {
			best, found = row, true
		}
	}
	return best, found
}

// under says whether key is row or a key under it.
func under(key, row string) bool {
	return key == row || strings.HasPrefix(key, row+".")
}

// RestartOnly names the keys whose values differ between cur and next
// and that only a restart of serve applies (those of ReloadTable's
// restart-only rows, each by its own name: "network.hosts",
// "state_dir"), in ConfigKeys' order; none when next can replace cur in
// a running serve. A key under no row counts as restart-only.
func RestartOnly(cur, next *Config) []string {
	a, b := configValues(cur), configValues(next)
	var keys []string
	for _, k := range ConfigKeys() {
		if row, ok := ReloadOf(k); (!ok || row.Restart) && !sameValue(a[k], b[k]) {
			keys = append(keys, k)
		}
	}
	return keys
}

// ConfigKeys are every key of the config, in the order of Config's
// fields: the dotted JSON path of each value that is not a section of
// keys of its own (a string, a number, a list, a map by name such as
// "tools" or "server.pool", a value read from its text such as a
// Duration), an embedded struct's keys as its own.
func ConfigKeys() []string {
	var keys []string
	walkConfig(reflect.ValueOf(Default()).Elem(), "", func(key string, _ reflect.Value) {
		keys = append(keys, key)
	})
	return keys
}

// configValues is each of ConfigKeys' values in c.
func configValues(c *Config) map[string]reflect.Value {
	vals := map[string]reflect.Value{}
	walkConfig(reflect.ValueOf(c).Elem(), "", func(key string, v reflect.Value) { vals[key] = v })
	return vals
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// walkConfig calls fn with each key under prefix of the struct v and
// its value, going into the fields that are sections.
func walkConfig(v reflect.Value, prefix string, fn func(key string, v reflect.Value)) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && isSection(f.Type) {
			walkConfig(v.Field(i), prefix, fn) // as Policy embeds Limits
			continue
		}
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		key := prefix + name
		if isSection(f.Type) {
			walkConfig(v.Field(i), key+".", fn)
			continue
		}
		fn(key, v.Field(i))
	}
}

// isSection says whether a value of t is a JSON object of keys decoded
// field by field: a struct that does not decode itself.
func isSection(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Kind() == reflect.Struct && !p.Implements(jsonUnmarshaler) && !p.Implements(textUnmarshaler)
}

// sameValue says whether two values of a key are the same: deeply
// equal, an empty list or map the same as none.
func sameValue(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Slice, reflect.Map:
		if a.Len() == 0 && b.Len() == 0 {
			return true
		}
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}
