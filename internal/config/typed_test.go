package config

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestTypedValues: durations, sizes and CIDR ranges are read once, at
// decode, into their typed fields, and shown as they were written.
func TestTypedValues(t *testing.T) {
	c, err := Parse([]byte(`{"limits": {"memory": "1.5g", "timeout": "1m30s"}, "policy": {"memory": "4GiB", "timeout": "2m"},
		"network": {"approval_timeout": "2m", "allow_ranges": ["10.1.2.3/16"], "deny_ranges": ["fd00::/8"],
			"host_ports": ["127.0.0.1:4222", "[::ffff:10.0.0.5]:80", "[fd00::1]:8080"]},
		"worker": {"ack_wait": "45s"}, "sessions": {"ttl": "2h", "max_bytes": "1g"}, "store_max_size": "500m",
		"server": {"listen": "tcp://127.0.0.1:7070", "token": "t"}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		got, want  any
		text, show string
	}{
		{"limits.memory", c.Limits.Memory.Bytes(), int64(3 << 29), c.Limits.Memory.String(), "1.5g"},
		{"limits.timeout", c.Limits.Timeout.Duration(), 90 * time.Second, c.Limits.Timeout.String(), "1m30s"},
		{"policy.memory", c.Policy.Memory.Bytes(), int64(4 << 30), c.Policy.Memory.String(), "4GiB"},
		{"policy.timeout", c.Policy.Timeout.Duration(), 2 * time.Minute, c.Policy.Timeout.String(), "2m"},
		{"network.approval_timeout", c.Network.ApprovalTimeout.Duration(), 2 * time.Minute, c.Network.ApprovalTimeout.String(), "2m"},
		{"network.allow_ranges", c.Network.AllowRanges[0], netip.MustParsePrefix("10.1.2.3/16"), c.Network.AllowRanges[0].String(), "10.1.2.3/16"},
		{"network.host_ports", c.Network.HostPorts[0], netip.MustParseAddrPort("127.0.0.1:4222"), c.Network.HostPorts[0].String(), "127.0.0.1:4222"},
		{"network.host_ports[2]", c.Network.HostPorts[2], netip.MustParseAddrPort("[fd00::1]:8080"), c.Network.HostPorts[2].String(), "[fd00::1]:8080"},
		{"worker.ack_wait", c.Worker.AckWait.Duration(), 45 * time.Second, c.Worker.AckWait.String(), "45s"},
		{"sessions.ttl", c.Sessions.TTL.Duration(), 2 * time.Hour, c.Sessions.TTL.String(), "2h"},
		{"sessions.max_bytes", c.Sessions.MaxBytes.Bytes(), int64(1 << 30), c.Sessions.MaxBytes.String(), "1g"},
		{"store_max_size", c.StoreMax.Bytes(), int64(500 << 20), c.StoreMax.String(), "500m"},
		{"server.listen", c.Server.Listen, Addr{Network: "tcp", Address: "127.0.0.1:7070"}, c.Server.Listen.String(), "tcp://127.0.0.1:7070"},
	} {
		if tc.got != tc.want || tc.text != tc.show {
			t.Errorf("%s = %v (%q); want %v (%q)", tc.name, tc.got, tc.text, tc.want, tc.show)
		}
	}
	if !c.Network.AllowRanges[0].Contains(netip.MustParseAddr("10.1.200.1")) {
		t.Error("allow_ranges 10.1.2.3/16 does not hold 10.1.200.1")
	}
	// null and "" leave a limit unset: the default stays (a merge keeps
	// it; an unset value is no value).
	c, err = Parse([]byte(`{"limits": {"memory": null}, "policy": {"timeout": null}}`))
	if err != nil || c.Limits.Memory != MustSize("256m") || c.Policy.Timeout != MustDuration("60s") {
		t.Errorf("null: %v, %v, %v; want the defaults", err, c.Limits.Memory, c.Policy.Timeout)
	}
	var l Limits
	if err := DecodeStrict([]byte(`{"memory": "", "timeout": ""}`), &l); err != nil || l.Memory.IsSet() || l.Timeout.IsSet() {
		t.Errorf(`"": %v, %+v; want unset`, err, l)
	}
}

// TestTypedValueErrors: a value that is not a duration, a size or a CIDR
// range is refused at decode, naming its key and why.
func TestTypedValueErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"server": {"listen": "x"}}`, `server.listen: "x": want unix:///path/to.sock or tcp://host:port`},
		{`{"server": {"listen": ""}}`, `server.listen: "": want unix:///path/to.sock`},
		{`{"server": {"listen": "unix://run/a.sock"}}`, `server.listen: "unix://run/a.sock": socket path must be absolute`},
		{`{"server": {"listen": "tcp://:"}}`, `server.listen: "tcp://:": want`},
		{`{"limits": {"memory": "x"}}`, `limits.memory: invalid size "x": want a number with an optional unit k, m, g or t`},
		{`{"limits": {"memory": 256}}`, `limits.memory: expected a string, got a number`},
		{`{"limits": {"tmp_size": "-1m"}}`, `limits.tmp_size: invalid size "-1m": negative`},
		{`{"limits": {"net_bytes": "1.5"}}`, `limits.net_bytes: invalid size "1.5": not a whole number of bytes`},
		{`{"limits": {"timeout": "5"}}`, `limits.timeout: invalid duration "5": want e.g. "5s" or "2m"`},
		{`{"limits": {"timeout": "0s"}}`, `limits.timeout: invalid duration "0s": must be greater than zero`},
		{`{"limits": {"timeout": {}}}`, `limits.timeout: expected a string, got an object`},
		{`{"policy": {"timeout": "soon"}}`, `policy.timeout: invalid duration "soon"`},
		{`{"policy": {"workspace_size": "1p"}}`, `policy.workspace_size: invalid size "1p"`},
		{`{"policy": {"memory": "0"}}`, `policy.memory: 0 must be greater than zero`},
		{`{"limits": {"memory": "0k"}}`, `limits.memory: 0k must be greater than zero`},
		{`{"network": {"approval_timeout": "-1s"}}`, `network.approval_timeout: invalid duration "-1s"`},
		{`{"network": {"approval_timeout": ""}}`, `network.approval_timeout: "": want a duration from 1s to 1h`},
		{`{"network": {"approval_timeout": "2h"}}`, `network.approval_timeout: "2h": want a duration from 1s to 1h`},
		{`{"network": {"deny_ranges": ["10.0.0.0"]}}`, `network.deny_ranges[0]: "10.0.0.0" is not a CIDR range (e.g. 10.0.0.0/8)`},
		{`{"network": {"allow_ranges": ["10.0.0.0/8", "10.0.0.0/33"]}}`, `network.allow_ranges[1]: "10.0.0.0/33" is not a CIDR range`},
		{`{"network": {"allow_ranges": [null]}}`, `network.allow_ranges[0]: null is not a CIDR range`},
		{`{"network": {"allow_ranges": [8]}}`, `network.allow_ranges[0]: expected a string, got a number`},
		{`{"network": {"host_ports": ["127.0.0.1"]}}`, `network.host_ports[0]: "127.0.0.1" is not an address and port (e.g. 127.0.0.1:4222 or [::1]:4222)`},
		{`{"network": {"host_ports": ["127.0.0.1:4222", "::1:80"]}}`, `network.host_ports[1]: "::1:80" is not an address and port`},
		{`{"network": {"host_ports": ["localhost:80"]}}`, `network.host_ports[0]: "localhost:80" is not an address and port`},
		{`{"network": {"host_ports": ["127.0.0.1:65536"]}}`, `network.host_ports[0]: "127.0.0.1:65536" is not an address and port`},
		{`{"network": {"host_ports": [4222]}}`, `network.host_ports[0]: expected a string, got a number`},
		{`{"network": {"host_ports": [null]}}`, `network.host_ports[0]: null is not an address and port`},
		{`{"network": {"host_ports": ["127.0.0.1:0"]}}`, `network.host_ports[0]: 127.0.0.1:0: port 0 is no port`},
		{`{"network": {"host_ports": ["0.0.0.0:80"]}}`, `network.host_ports[0]: 0.0.0.0:80: name one address of the host, not the unspecified address`},
		{`{"network": {"host_ports": ["[::]:80"]}}`, `network.host_ports[0]: [::]:80: name one address`},
		{`{"network": {"host_ports": ["[fe80::1%eth0]:80"]}}`, `network.host_ports[0]: [fe80::1%eth0]:80: an address with a zone is never dialled`},
		{`{"worker": {"ack_wait": "0s"}}`, `worker.ack_wait: invalid duration "0s": must be greater than zero`},
		{`{"worker": {"ack_wait": "500ms"}}`, `worker.ack_wait: 500ms: must be at least 1s`},
		{`{"worker": {"result_ttl": ""}}`, `worker.result_ttl: required`},
		{`{"sessions": {"ttl": ""}}`, `sessions.ttl: required`},
		{`{"sessions": {"max_bytes": "lots"}}`, `sessions.max_bytes: invalid size "lots"`},
		{`{"sessions": {"max_bytes": "1m"}}`, `sessions.max_bytes: "1m": must be between 16m and 64g`},
		{`{"store_max_size": "0"}`, `store_max_size: "0": want a size such as "20g"`},
		{`{"store_max_size": "big"}`, `store_max_size: invalid size "big"`},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v; want %q", tc.in, err, tc.want)
		}
	}
}

// TestTypedValuesRoundTrip: a config written as JSON reads back the same,
// its durations and sizes written as they were read; unset limits are
// left out.
func TestTypedValuesRoundTrip(t *testing.T) {
	c, err := Parse([]byte(`{"limits": {"memory": "1.5g"}, "network": {"allow_ranges": ["10.1.2.3/16"], "host_ports": ["[::1]:4222"]}, "sessions": {"ttl": "90m"}}`))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"memory":"1.5g"`, `"timeout":"60s"`, `"allow_ranges":["10.1.2.3/16"]`, `"host_ports":["[::1]:4222"]`, `"ttl":"90m"`, `"store_max_size":"20g"`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("%s lacks %s", data, want)
		}
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("read back:\n%+v\nwant\n%+v", back, c)
	}
	if b, _ := json.Marshal(Limits{Pids: ptr[int64](3)}); string(b) != `{"pids":3}` {
		t.Errorf("Limits with pids only: %s; want the others left out", b)
	}
}

// TestStateBytes: sessions.state_max_bytes is 64m, or max_bytes when that
// is smaller, unless the config sets it.
func TestStateBytes(t *testing.T) {
	for _, c := range []struct {
		json string
		want int64
	}{
		{`{}`, 64 << 20},
		{`{"sessions": {"max_bytes": "32m"}}`, 32 << 20},
		{`{"sessions": {"state_max_bytes": "8m"}}`, 8 << 20},
	} {
		cfg, err := Parse([]byte(c.json))
		if err != nil {
			t.Fatalf("%s: %v", c.json, err)
		}
		if got := cfg.Sessions.StateBytes(); got != c.want {
			t.Errorf("%s: %d; want %d", c.json, got, c.want)
		}
	}
}
