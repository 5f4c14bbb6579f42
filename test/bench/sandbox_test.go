package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestStatusKB: a field of /proc/PID/status is read in kB; a missing or
// unreadable one is not.
func TestStatusKB(t *testing.T) {
	status := "Name:\tsh\nVmRSS:\t    3712 kB\nRssAnon:\t     204 kB\nThreads:\t1\nVmBad:\tx kB\n"
	for field, want := range map[string]int64{"VmRSS": 3712, "RssAnon": 204} {
		if got, ok := statusKB(status, field); !ok || got != want {
			t.Errorf("%s: %d %v, want %d", field, got, ok, want)
		}
	}
	for _, field := range []string{"VmSwap", "VmBad", "RSS"} {
		if got, ok := statusKB(status, field); ok {
			t.Errorf("%s: %d, want none", field, got)
		}
	}
}

// TestSbMemoryBeyond: the cgroups' usage less the processes' own memory,
// plus serve's growth, per sandbox; none for no sandbox.
func TestSbMemoryBeyond(t *testing.T) {
	m := sbMemory{n: 4, cgroup: 40 << 20, procs: 12 << 20, rss: 100 << 20, serve: 8 << 20}
	if got := m.beyond(); got != 9<<20 {
		t.Errorf("beyond = %d, want %d", got, 9<<20)
	}
	if got := (sbMemory{}).beyond(); got != 0 {
		t.Errorf("no sandbox: %d", got)
	}
}

// TestCensusLeft: only what there is more of after is left; a failed
// listing is said.
func TestCensusLeft(t *testing.T) {
	before := census{listed: 1, cgroups: 3, mounts: 6}
	if got := before.left(census{listed: 1, cgroups: 3, mounts: 6}); got != "" {
		t.Errorf("nothing left: %q", got)
	}
	if got := before.left(census{listed: 0, cgroups: 2, mounts: 6}); got != "" {
		t.Errorf("fewer: %q", got)
	}
	if got := before.left(census{listed: 3, cgroups: 5, mounts: 7}); got != "2 sandboxes listed, 2 cgroups, 1 mounts" {
		t.Errorf("left: %q", got)
	}
	if got := before.left(census{listed: 1, cgroups: 3, mounts: 6, err: errors.New("refused")}); !strings.Contains(got, "refused") {
		t.Errorf("failed listing: %q", got)
	}
}

// TestSandboxTargets: each target's ratio of medians against its bound,
// "not measured" where either side was not, the memory target from the
// many sandboxes, and a leak is a target not met.
func TestSandboxTargets(t *testing.T) {
	times := func(ms ...int) []time.Duration {
		var d []time.Duration
		for _, m := range ms {
			d = append(d, time.Duration(m)*time.Millisecond)
		}
		return d
	}
	ss := &sandboxSection{
		cs: []*contender{
			{name: sbPooledName, times: times(40, 50, 60)},
			{name: sbPoolName, times: times(90, 100, 130)},
			{name: sbExecName, times: times(30, 31, 90)},
			{name: runcExecName, err: "runc run -d: exit status 1"},
			{name: shTrueName, times: times(5, 5, 6)},
		},
		many: manySandboxes{mem: sbMemory{n: 32, cgroup: 64 << 20, procs: 32 << 20, serve: 32 << 20}},
	}
	got := map[string][3]string{}
	for _, r := range sandboxTargets(ss) {
		got[strings.Fields(r[0])[2]+" "+strings.Fields(r[0])[3]] = r
	}
	check := func(key, measured, met string) {
		t.Helper()
		r, ok := got[key]
		if !ok {
			t.Fatalf("no target %q in %v", key, got)
		}
		if !strings.HasPrefix(r[1], measured) || r[2] != met {
			t.Errorf("%s: %q %q, want %q… %q", key, r[1], r[2], measured, met)
		}
	}
	check("from the", "2.00× (100.0 ms against 50.0 ms)", "yes")
	check("exec `true`", "not measured", "–")
	check("sandbox ≤", "2.0 MiB each over 32", "yes")
	check("sandboxes at", "nothing left", "yes")

	ss.cs[1].times = times(101, 101, 101)
	ss.cs[3] = &contender{name: runcExecName, times: times(20, 20, 20)}
	ss.many.mem.serve = 160 << 20
	ss.many.left = "1 cgroups"
	got = map[string][3]string{}
	for _, r := range sandboxTargets(ss) {
		got[strings.Fields(r[0])[2]+" "+strings.Fields(r[0])[3]] = r
	}
	check("from the", "2.02×", "no")
	check("exec `true`", "1.55× (31.0 ms against 20.0 ms)", "no")
	check("sandbox ≤", "6.0 MiB each", "no")
	check("sandboxes at", "1 cgroups", "no")

	ss.many.err = "create: refused"
	got = map[string][3]string{}
	for _, r := range sandboxTargets(ss) {
		got[strings.Fields(r[0])[2]+" "+strings.Fields(r[0])[3]] = r
	}
	check("sandbox ≤", "not measured", "–")
	check("sandboxes at", "not measured", "–")
}
