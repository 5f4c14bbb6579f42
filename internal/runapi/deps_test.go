package runapi

import (
	"os/exec"
	"strings"
	"testing"
)

// The doors and this package build without the runner and the runtimes:
// none of them depends, however indirectly, on libcontainer, the OCI
// runtime spec, cgroups or agentrun's own runner and runtime packages.
// (The image-spec and go-digest modules that go-containerregistry brings
// are not runtimes.)
func TestDoorsImportNoRuntime(t *testing.T) {
	// go test puts its own go first in PATH.
	out, err := exec.Command("go", goListDeps(doorDirs(".")...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	banned := []string{
		"github.com/opencontainers/runc",
		"github.com/opencontainers/runtime-spec",
		"github.com/opencontainers/cgroups",
		"github.com/agentrun/agentrun/internal/runner",
		"github.com/agentrun/agentrun/runtime/",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if strings.HasPrefix(dep, b) {
				t.Errorf("a door or runapi depends on %s", dep)
			}
		}
	}
}

// The doors and this package build without the proxy and the namespaces:
// they share holds and their decisions through internal/approvals and the
// network's report through internal/netpolicy, and serve is handed the proxy's test of a
// sandbox's connection as a function value; the image store is handed
// internal/hostaddr's check of the host's addresses by the runner, so no
// door links netlink either.
func TestDoorsImportNoProxy(t *testing.T) {
	out, err := exec.Command("go", goListDeps(doorDirs(".", "../approvals")...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	banned := []string{
		"github.com/agentrun/agentrun/proxy",
		"github.com/agentrun/agentrun/netns",
		"github.com/vishvananda/netlink",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, b+"/") {
				t.Errorf("a door, approvals or runapi depends on %s", dep)
			}
		}
	}
}

// doors are the packages through which a task or a person reaches the
// runner, each on a protocol of its own: a new door is a row here, and
// every rule of this file holds for it.
var doors = []string{"internal/server", "internal/worker", "internal/mcpserver", "internal/e2b"}

// doorDirs are the doors' directories from here, and then extra.
func doorDirs(extra ...string) []string {
	var dirs []string
	for _, d := range doors {
		dirs = append(dirs, "../../"+d)
	}
	return append(dirs, extra...)
}

// goListDeps are go list's arguments for what pkgs depend on.
func goListDeps(pkgs ...string) []string {
	return append([]string{"list", "-tags", "seccomp,runc_nocriu", "-deps"}, pkgs...)
}

// No door depends on another: what they share (a refusal, the approver
// handed on with a task) is in this package, and a door that hands a
// task to another is handed the other's function (cmd/agentrun wires
// serve's RunTask into MCP).
func TestDoorsImportNoDoor(t *testing.T) {
	const module = "github.com/agentrun/agentrun/"
	for _, door := range doors {
		out, err := exec.Command("go", goListDeps("../../"+door)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v: %s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, other := range doors {
				if other != door && (dep == module+other || strings.HasPrefix(dep, module+other+"/")) {
					t.Errorf("%s depends on %s", door, dep)
				}
			}
		}
	}
}

// The doors, the config and the task build without the image store and
// its registry client: policy.registries is read by the syntax alone
// (internal/endpoint) and handed to the store where the runner builds it,
// and serve tells an image's error by its field (image.Error.Field). The
// config links neither the approvals' webhook nor the uid pool either:
// it checks a webhook's URL and run_uids by their syntax
// (internal/endpoint, internal/uidrange).
func TestDoorsImportNoImageStore(t *testing.T) {
	banned := []string{
		"github.com/agentrun/agentrun/image",
		"github.com/google/go-containerregistry",
	}
	configBanned := append(banned,
		"github.com/agentrun/agentrun/internal/approvals",
		"github.com/agentrun/agentrun/internal/uidpool")
	for _, tc := range []struct {
		pkgs   []string
		banned []string
	}{
		{[]string{".", "../server", "../worker", "../mcpserver", "../e2b"}, banned},
		{[]string{"../config", "../task"}, configBanned},
	} {
		// go test puts its own go first in PATH.
		out, err := exec.Command("go", append([]string{"list", "-tags", "seccomp,runc_nocriu", "-deps"}, tc.pkgs...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v: %s", err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, b := range tc.banned {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%v depend on %s", tc.pkgs, dep)
				}
			}
		}
	}
}
