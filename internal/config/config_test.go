package config

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestDefaultIsValid(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Image != "python:3.12-slim" || c.Limits.Timeout.String() != "5s" || c.Limits.Memory.String() != "256m" || *c.Limits.CPUs != 0.5 ||
		*c.Limits.Pids != 64 || *c.Limits.OutputBytes != 65536 || c.Limits.TmpSize.String() != "64m" || *c.Policy.NetConns != 256 ||
		!*c.Policy.AllowNetwork || c.Runtime != "libcontainer" || c.Server.Quota != (Quota{60, 2}) {
		t.Errorf("unexpected defaults: %+v", c)
	}
	// Each call is independent.
	*Default().Limits.CPUs = 9
	Default().Languages["x"] = nil
	if *Default().Limits.CPUs != 0.5 || len(Default().Languages) != 5 {
		t.Error("Default shares state between calls")
	}
}

func TestParseMergesOverDefaults(t *testing.T) {
	c, err := Parse([]byte(`{
		"limits": {"memory": "512m"},
		"policy": {"cpus": 4},
		"languages": {"ruby": ["ruby", "{file}"], "node": null},
		"server": {"quota": {"concurrent": 5}, "pool": {"python:3.12-slim": 2}},
		"network": {"hosts": {"pypi.internal": "203.0.113.7"}, "allow_ranges": ["10.1.0.0/16"]},
		"env": {"MPLBACKEND": "Agg"}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	if c.Limits.Memory.String() != "512m" || c.Limits.Timeout != d.Limits.Timeout || *c.Limits.CPUs != 0.5 {
		t.Errorf("limits not merged per field: %+v", c.Limits)
	}
	if *c.Policy.CPUs != 4 || c.Policy.Memory.String() != "2g" {
		t.Errorf("policy not merged per field: %+v", c.Policy)
	}
	if !reflect.DeepEqual(c.Languages["ruby"], []string{"ruby", "{file}"}) || c.Languages["python"] == nil {
		t.Errorf("languages not merged per key: %v", c.Languages)
	}
	if _, ok := c.Languages["node"]; ok {
		t.Error("a null language should be removed")
	}
	if c.Server.Quota != (Quota{RunsPerMinute: 60, Concurrent: 5}) || c.Server.MaxConcurrent != 8 || c.Server.Pool["python:3.12-slim"].Count != 2 {
		t.Errorf("server not merged: %+v", c.Server)
	}
	if c.Env["MPLBACKEND"] != "Agg" || c.Network.Hosts["pypi.internal"] != netip.MustParseAddr("203.0.113.7") || c.StateDir != "/run/agentrun/state" {
		t.Errorf("unexpected config: %+v", c)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ in, want string }{
		{`{"polcy": {}}`, `unknown field "polcy"`},
		{`{"server": {"quota": {"burst": 1}}}`, `unknown field "server.quota.burst"`},
		{`{"limits": {"memroy": "1g"}}`, `unknown field "limits.memroy"`},
		{`{"Image": "x"}`, `unknown field "Image"`},
		{`{} {}`, "unexpected data after the JSON object"},
		{`{"limits": {"cpus": "1"}}`, "limits.cpus: expected a number"},
		{`{"image": ""}`, "image: image is required"},
		{`{"image": "a b"}`, "image: "},
		{`{"image": "` + strings.Repeat("a", 1025) + `"}`, "image: longer than"},
		{`{"language": "cobol"}`, `language: "cobol" is not in languages`},
		{`{"languages": null}`, "language: "},
		{`{"runtime": "docker"}`, "runtime: "},
		{`{"limits": {"timeout": "5"}}`, "limits.timeout: invalid duration"},
		{`{"limits": {"timeout": "0s"}}`, "limits.timeout: "},
		{`{"limits": {"timeout": ""}}`, "limits.timeout: required"},
		{`{"limits": {"memory": "lots"}}`, "limits.memory: invalid size"},
		{`{"limits": {"memory": "0"}}`, "limits.memory: "},
		{`{"limits": {"tmp_size": "-1m"}}`, "limits.tmp_size: "},
		{`{"limits": {"workspace_size": "2g"}}`, "limits.workspace_size: 2g exceeds policy maximum 1g"},
		{`{"limits": {"net_bytes": "x"}}`, "limits.net_bytes: "},
		{`{"limits": {"cpus": 0}}`, "limits.cpus: "},
		{`{"limits": {"cpus": null}}`, "limits.cpus: required"},
		{`{"limits": {"cpus": 3}}`, "limits.cpus: 3 exceeds policy maximum 2"},
		{`{"limits": {"pids": -1}}`, "limits.pids: "},
		{`{"limits": {"output_bytes": 0}}`, "limits.output_bytes: "},
		{`{"limits": {"net_connections": 1000}}`, "limits.net_connections: 1000 exceeds policy maximum 256"},
		{`{"limits": {"memory": "3g"}}`, "limits.memory: 3g exceeds policy maximum 2g"},
		{`{"policy": {"timeout": "1s"}}`, "limits.timeout: 5s exceeds policy maximum 1s"},
		{`{"policy": {"memory": "nope"}}`, "policy.memory: "},
		{`{"policy": {"pids": 0}}`, "policy.pids: "},
		{`{"policy": {"allow_network": null}}`, "policy.allow_network: required"},
		{`{"env": {"PATH": "/x"}}`, `env["PATH"]: `},
		{`{"env": {"1X": "y"}}`, `env["1X"]: `},
		{`{"languages": {"x": []}}`, `languages["x"]: argv is empty`},
		{`{"languages": {"x": ["a", ""]}}`, `languages["x"]: argv[1]`},
		{`{"languages": {"a b": ["a"]}}`, `languages["a b"]: `},
		{`{"network": {"hosts": {"pypi.internal": "not-an-ip"}}}`, `network.hosts["pypi.internal"]: "not-an-ip" is not an IP address`},
		{`{"network": {"hosts": {"pypi.internal": ""}}}`, `network.hosts["pypi.internal"]: "" is not an IP address`},
		{`{"network": {"hosts": {"pypi.internal": 1}}}`, `network.hosts["pypi.internal"]: expected a string`},
		{`{"network": {"hosts": {"bad_name": "1.2.3.4"}}}`, `network.hosts["bad_name"]: `},
		{`{"network": {"allow_ranges": ["10.0.0.0"]}}`, `network.allow_ranges[0]: `},
		{`{"network": {"deny_ranges": ["fd00::/8", "x"]}}`, `network.deny_ranges[1]: `},
		{`{"runsc": {"path": "runsc"}}`, "runsc.path: "},
		{`{"runtime": "runsc", "runsc": {"path": ""}}`, "runsc.path: required"},
		{`{"runsc": {"flags": [""]}}`, "runsc.flags[0]: "},
		{`{"server": {"listen": "/run/x.sock"}}`, "server.listen: "},
		{`{"server": {"listen": "unix://x.sock"}}`, "server.listen: "},
		{`{"server": {"listen": "tcp://nohost"}}`, "server.listen: "},
		{`{"server": {"max_concurrent": 0}}`, "server.max_concurrent: "},
		{`{"server": {"queue": -1}}`, "server.queue: "},
		{`{"server": {"quota": {"runs_per_minute": -1}}}`, "server.quota.runs_per_minute: "},
		{`{"server": {"pool": {"img": -1}}}`, `server.pool["img"]: `},
		{`{"server": {"pool": {"img": {"count": -1}}}}`, `server.pool["img"]: `},
		{`{"server": {"pool": {"img": "2"}}}`, `server.pool["img"]: expected a count or an object`},
		{`{"server": {"pool": {"img": 1.5}}}`, `server.pool["img"]: 1.5 is not an integer`},
		{`{"server": {"pool": {"img": {"count": 1, "hot": true}}}}`, `unknown field "server.pool[\"img\"].hot"`},
		{`{"server": {"pool": {"img": {"count": 1, "warm": {"language": "cobol"}}}}}`, `server.pool["img"].warm.language: "cobol" is not in languages`},
		{`{"languages": {"py": ["python3", "-c", "exec(open('{file}').read())"]}, "server": {"pool": {"img": {"count": 1, "warm": {"language": "py"}}}}}`,
			`server.pool["img"].warm.language: languages["py"] must have "{file}" as one argument`},
		{`{"server": {"pool": {"img": {"count": 1, "warm": {"language": "python", "preload": ["os; import x"]}}}}}`,
			`server.pool["img"].warm.preload[0]: "os; import x" is not a Python module name`},
		{`{"server": {"pool": {"img": {"count": 1, "warm": {"language": "python", "preload": ["a..b"]}}}}}`, `server.pool["img"].warm.preload[0]: `},
		{`{"runtime": "runsc", "server": {"pool": {"img": {"count": 1, "warm": {"language": "python"}}}}}`,
			`server.pool["img"].warm: warm pools run on libcontainer only, and runtime is runsc`},
		{`{"server": {"token": "a b"}}`, "server.token: "},
		{`{"sessions": {"ttl": "0s"}}`, "sessions.ttl: "},
		{`{"sessions": {"ttl": "soon"}}`, "sessions.ttl: "},
		{`{"sessions": {"max": 0}}`, "sessions.max: "},
		{`{"sessions": {"max_bytes": "1m"}}`, "sessions.max_bytes: "},
		{`{"sessions": {"max_bytes": "1t"}}`, "sessions.max_bytes: "},
		{`{"sessions": {"max_bytes": "lots"}}`, "sessions.max_bytes: "},
		{`{"sessions": {"state_max_bytes": "100k"}}`, "sessions.state_max_bytes: "},
		{`{"sessions": {"max_bytes": "32m", "state_max_bytes": "64m"}}`, "sessions.state_max_bytes: "},
		{`{"sessions": {"size": "1g"}}`, `unknown field "sessions.size"`},
		{`{"sandboxes": {"max": 0}}`, "sandboxes.max: "},
		{`{"sandboxes": {"per_user": -1}}`, "sandboxes.per_user: "},
		{`{"sandboxes": {"max": 4, "per_user": 5}}`, "sandboxes.per_user: "},
		{`{"sandboxes": {"max_memory": "1m"}}`, "sandboxes.max_memory: "},
		{`{"sandboxes": {"max_lifetime": "0s"}}`, "sandboxes.max_lifetime: "},
		{`{"sandboxes": {"max_lifetime": "48h"}}`, "sandboxes.max_lifetime: "},
		{`{"sandboxes": {"default_timeout": "2h"}}`, "sandboxes.default_timeout: "},
		{`{"sandboxes": {"max_lifetime": "1m"}}`, "sandboxes.default_timeout: "},
		{`{"store_dir": "var/lib"}`, "store_dir: "},
		{`{"state_dir": "/run/../x"}`, "state_dir: "},
		{`{"audit": "audit.log"}`, "audit: "},
		{`{"seccomp_helper": "agentrun-seccomp"}`, "seccomp_helper: "},
		{`{"seccomp_helper": "/usr/lib/../x"}`, "seccomp_helper: "},
		{`{"policy": {"registries": ["http://127.0.0.1:5000"]}}`, "policy.registries[0]: "},
		{`{"policy": {"registries": ["ok.example", "a/b"]}}`, "policy.registries[1]: "},
		{`{"store_max_size": "0"}`, "store_max_size: "},
		{`{"store_max_size": "big"}`, "store_max_size: "},
		{`{"run_uids": {"first": 1000, "count": 10}}`, "run_uids: first 1000 is below 65536"},
		{`{"run_uids": {"first": 2000000000, "count": 0}}`, "run_uids: count must be at least 1"},
		{`{"run_uids": {"first": 4294967290, "count": 10}}`, "run_uids: range 4294967290+10 ends past"},
		{`{"run_uids": {"first": -1}}`, "run_uids: first -1 is below"},
		{`{"run_uids": {"start": 100000}}`, `unknown field "run_uids.start"`},
		{`{"cgroup_parent": "agentrun"}`, "cgroup_parent: "},
		{`{"cgroup_parent": "/"}`, "cgroup_parent: "},
		{`{"cgroup_parent": "/agentrun/../x"}`, "cgroup_parent: "},
		{`{"cgroup_parent": "/agent run"}`, "cgroup_parent: "},
		{`{"cgroup_parent": ""}`, "cgroup_parent: "},
	}
	for _, tc := range cases {
		_, err := Parse([]byte(tc.in))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v; want error starting %q", tc.in, err, tc.want)
		}
	}
	for _, ok := range []string{
		`{}`, `{"audit": "-"}`, `{"audit": ""}`, `{"server": {"listen": "tcp://127.0.0.1:8080", "token": "s3cret"}}`,
		`{"runtime": "runsc"}`, `{"limits": {"memory": "2GiB"}}`, `{"network": {"allow_ranges": ["fd00::/8"]}}`,
		`{"policy": {"registries": ["docker.io", "127.0.0.1:5000", "[::1]:5000", "registry.internal"]}}`, `{"store_max_size": "500m"}`,
		`{"seccomp_helper": "off"}`, `{"seccomp_helper": "/usr/lib/agentrun/agentrun-seccomp"}`,
		`{"server": {"pool": {"a": 2, "b": {"count": 1}, "c": {"count": 3, "warm": {"language": "python", "preload": ["numpy", "os.path", "_x1"]}}}}}`,
		`{"runtime": "runsc", "server": {"pool": {"img": 2}}}`,
	} {
		if _, err := Parse([]byte(ok)); err != nil {
			t.Errorf("Parse(%s) = %v; want ok", ok, err)
		}
	}
}

// TestPoolEntries: a pool value is a count or {"count", "warm"}, and one
// without warm is written back as its count.
func TestPoolEntries(t *testing.T) {
	c, err := Parse([]byte(`{"server": {"pool": {"a": 2, "b": {"count": 4, "warm": {"language": "python", "preload": ["numpy", "pandas"]}}, "c": {"count": 1}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if sizes := c.Server.PoolSizes(); !reflect.DeepEqual(sizes, map[string]int{"a": 2, "b": 4, "c": 1}) {
		t.Errorf("PoolSizes = %v", sizes)
	}
	want := map[string]Warm{"b": {Language: "python", Preload: []string{"numpy", "pandas"}}}
	if warm := c.Server.PoolWarm(); !reflect.DeepEqual(warm, want) {
		t.Errorf("PoolWarm = %v; want %v", warm, want)
	}
	b, err := json.Marshal(c.Server.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != `{"a":2,"b":{"count":4,"warm":{"language":"python","preload":["numpy","pandas"]}},"c":1}` {
		t.Errorf("marshalled pool = %s", got)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	c, err := Load(write("ok.json", `{"image": "node:22-slim", "language": "node"}`))
	if err != nil || c.Image != "node:22-slim" || c.Language != "node" || c.Limits.Memory.String() != "256m" {
		t.Fatalf("Load = %+v, %v", c, err)
	}

	missing := filepath.Join(dir, "missing.json")
	if _, err := Load(missing); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("explicit missing path: %v; want error", err)
	}
	if c, err := load(missing, true); err != nil || !reflect.DeepEqual(c, Default()) {
		t.Errorf("missing default path: %v, %v; want Default()", c, err)
	}
	if _, err := os.Stat(DefaultPath); os.IsNotExist(err) {
		if c, err := Load(""); err != nil || !reflect.DeepEqual(c, Default()) {
			t.Errorf(`Load("") without %s = %v; want Default()`, DefaultPath, err)
		}
	}

	p := write("typo.json", `{"polcy": {}}`)
	if _, err := Load(p); err == nil || err.Error() != "config "+p+`: unknown field "polcy"` {
		t.Errorf("unknown key: %v", err)
	}
	big := write("big.json", `{"image": "`+strings.Repeat("a", MaxFileBytes)+`"}`)
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversize: %v", err)
	}
	if _, err := Load(dir); err == nil {
		t.Error("a directory should not load")
	}
}

// TestDefaultSocketOutsideStateDir: the default socket's directory is not
// the state dir nor inside it, so that the agentrun group can reach the
// socket while the state dir stays root's alone.
func TestDefaultSocketOutsideStateDir(t *testing.T) {
	d := Default()
	dir := filepath.Dir(d.Server.Listen.Address)
	if rel, err := filepath.Rel(d.StateDir, dir); err != nil || rel == "." || !strings.HasPrefix(rel, "..") {
		t.Fatalf("socket dir %s is inside state_dir %s", dir, d.StateDir)
	}
}
