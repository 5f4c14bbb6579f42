package toolbroker

import (
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/uidpool"
)

func TestServersFromConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"tools": {
		"gh": {"command": ["/bin/gh", "stdio"], "env": {"B": {"value": "2"}, "A": {"prefix": "x ", "file": "/s/a"}}, "allow": ["api.github.com"],
		       "rules": [{"tools": ["get_*"]}, {"tools": ["create_*"], "approve": true}]},
		"ids": {"command": ["/bin/x"], "user": "1000:1001", "shared": true, "rules": [{"tools": ["*"]}]},
		"daemon": {"command": ["/bin/x"], "user": "daemon", "rules": [{"tools": ["*"]}]},
		"docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": {"prefix": "Bearer ", "file": "/s/d"}}}},
		"tool_limits": {"calls": 5, "call_timeout": "3s"}}`))
	if err != nil {
		t.Fatal(err)
	}
	servers, err := ServersFromConfig(cfg.Tools, []string{"docs", "gh", "ids"})
	if err != nil {
		t.Fatal(err)
	}
	docs, gh, ids := servers[0], servers[1], servers[2]
	if docs.URL == "" || len(docs.Headers) != 1 || docs.Headers[0].Header != "Authorization" || docs.Headers[0].File != "/s/d" || docs.UID != 0 {
		t.Errorf("docs = %+v", docs)
	}
	if gh.UID != 65534 || gh.GID != 65534 || len(gh.Allow) != 1 || gh.Allow[0] != "api.github.com" || len(gh.Env) != 2 || gh.Env[0] != (EnvVar{Name: "A", Prefix: "x ", File: "/s/a"}) || !gh.Rules[1].Approve {
		t.Errorf("gh = %+v", gh)
	}
	if ids.UID != 1000 || ids.GID != 1001 || !ids.Shared {
		t.Errorf("ids = %+v", ids)
	}
	if pw, err := user.Lookup("daemon"); err == nil {
		s, err := ServersFromConfig(cfg.Tools, []string{"daemon"})
		if err != nil || s[0].UID == 0 || pw.Uid != itoa(s[0].UID) {
			t.Errorf("daemon = %+v, %v", s, err)
		}
	}
	if _, err := ServersFromConfig(cfg.Tools, []string{"nope"}); err == nil || !strings.Contains(err.Error(), `"nope" is not a tool server`) ||
		errkind.Of(err) != errkind.Policy {
		t.Errorf("unknown: %v (kind %v), want a refusal by policy", err, errkind.Of(err))
	}
	cfg.Tools["ghost"] = config.ToolServer{Command: []string{"/bin/x"}, User: "no-such-user-here"}
	if _, err := ServersFromConfig(cfg.Tools, []string{"ghost"}); err == nil || !strings.Contains(err.Error(), `tools["ghost"]: user:`) {
		t.Errorf("unknown user: %v", err)
	}
	if l := LimitsFromConfig(cfg.ToolLimits); l != (Limits{Calls: 5, Concurrent: config.DefaultToolConcurrent, ArgumentBytes: config.DefaultToolArgBytes,
		ResultBytes: config.DefaultToolResBytes, CallTimeout: 3 * time.Second}) {
		t.Errorf("limits = %+v", l)
	}
	if _, err := New(Options{Servers: servers, Limits: Limits{}}); err == nil {
		t.Error("New with zero limits: no error")
	}
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

// ReclaimShared frees the uids of the shared servers of an agentrun whose
// lock in dir is gone or no longer held, and removes its lock, leaving a
// live Shared's, runs' and other dirs' reservations.
func TestReclaimShared(t *testing.T) {
	dir := t.TempDir()
	uids, err := uidpool.Open(filepath.Join(t.TempDir(), "uids"), 100000, 8)
	if err != nil {
		t.Fatal(err)
	}
	live := &Shared{Dir: dir}
	liveOwner, err := live.uidOwner("ev")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	deadLock := filepath.Join(dir, sharedLock+"0123")
	if err := os.WriteFile(deadLock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	owners := map[string]bool{ // owner: reclaimed
		liveOwner:                               false,
		deadLock + "/ev":                        true,
		filepath.Join(dir, sharedLock+"gone/x"): true,
		"/state/runs/ar-1/tool-ev":              false,
		filepath.Join(dir, "other/ev"):          false,
	}
	ids := map[string]uint32{}
	for owner := range owners {
		if ids[owner], err = uids.Take(owner); err != nil {
			t.Fatal(err)
		}
	}
	freed, err := ReclaimShared(uids, dir)
	if err != nil {
		t.Fatal(err)
	}
	held, _ := uids.Held()
	for owner, reclaimed := range owners {
		if _, ok := held[ids[owner]]; ok == reclaimed {
			t.Errorf("%s: held %v after ReclaimShared (freed %v)", owner, ok, freed)
		}
	}
	if _, err := os.Stat(deadLock); !os.IsNotExist(err) {
		t.Errorf("the dead lock is left: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(liveOwner)); err != nil {
		t.Errorf("the live lock: %v", err)
	}
}
