package toolbroker

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/runtime/cgroup"
)

// needRoot skips t without root, or fails it with $AGENTRUN_TEST_ROOT=1.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("AGENTRUN_TEST_ROOT") == "1" {
			t.Fatal("needs root: " + why + " ($AGENTRUN_TEST_ROOT=1)")
		}
		t.Skip("needs root: " + why)
	}
}

// cgroupOf is the cgroup path of pid in the hierarchy of controller (v1),
// or the unified one.
func cgroupOf(t *testing.T, pid int, controller string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 && (cgroup.Unified() && f[0] == "0" || strings.Contains(","+f[1]+",", ","+controller+",")) {
			return f[2]
		}
	}
	t.Fatalf("process %d: no %s cgroup in %s", pid, controller, b)
	return ""
}

func TestRootCgroupAndUser(t *testing.T) {
	needRoot(t, "a stdio server runs as nobody in a cgroup of its own")
	parent := "/agentrun-test-toolbroker-" + strconv.Itoa(os.Getpid())
	t.Cleanup(func() {
		// In every hierarchy the host has (v1 makes it in each), children
		// first: the broker, without a lock dir, leaves the parent. Made
		// before the broker, so that it runs after the broker's Close.
		if cg, err := cgroup.Open(parent); err == nil {
			if err := cg.Remove(); err != nil {
				t.Error(err)
			}
		}
	})
	b := newBroker(t, Options{Servers: []Server{stdioServer(t, "stdio")}, CgroupParent: parent})
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, body := call(t, b, "local", "get_ids", `{}`)
	ids := strings.Split(text(t, body), ":")
	if ids[0] != "65534" || ids[1] != "65534" {
		t.Errorf("the server runs as %s:%s; want nobody", ids[0], ids[1])
	}
	server, _ := strconv.Atoi(ids[2])
	_, body = call(t, b, "local", "fork", `{"setsid": true}`)
	child, _ := strconv.Atoi(text(t, body))
	want := parent + "/tool-r-test-local"
	for _, pid := range []int{server, child} {
		for _, c := range []string{"pids", "memory"} {
			if got := cgroupOf(t, pid, c); got != want {
				t.Errorf("process %d: %s cgroup %s; want %s", pid, c, got, want)
			}
		}
	}
	limits := map[string]string{"pids/pids.max": "64", "memory/memory.limit_in_bytes": strconv.Itoa(ServerMemory)}
	if cgroup.Unified() {
		limits = map[string]string{"pids.max": "64", "memory.max": strconv.Itoa(ServerMemory)}
	}
	for f, v := range limits {
		if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", filepath.Dir(f), want, filepath.Base(f))); err != nil || strings.TrimSpace(string(b)) != v {
			t.Errorf("%s = %q, %v; want %s", f, b, err, v)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(server) || !gone(child) {
		t.Errorf("after Close: server %d or its child %d in a session of its own left", server, child)
	}
	for _, c := range []string{"pids", "memory"} {
		d := filepath.Join("/sys/fs/cgroup", c, want)
		if cgroup.Unified() {
			d = filepath.Join("/sys/fs/cgroup", want)
		}
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left after Close: %v", d, err)
		}
	}
}
