package runc

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWarmCgroupLockLeavesProcessInPlace checks that the warm-up write
// targets this process's own cgroup and moves nothing.
func TestWarmCgroupLockLeavesProcessInPlace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test must run as root")
	}
	p := ownProcsFile()
	if p == "" {
		t.Fatal("no cgroup.procs file found for this process")
	}
	procs, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !containsPid(string(procs), os.Getpid()) {
		t.Fatalf("%s does not list this process (%d)", p, os.Getpid())
	}
	before, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	WarmCgroupLock()
	// The write is asynchronous; it is done well within a grace period.
	time.Sleep(200 * time.Millisecond)
	after, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Fatalf("cgroups changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func containsPid(procs string, pid int) bool {
	for _, f := range strings.Fields(procs) {
		if f == strconv.Itoa(pid) {
			return true
		}
	}
	return false
}
