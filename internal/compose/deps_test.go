package compose

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/agentrun/agentrun/"

// goList is `go list -deps`-style output of patterns: each package's
// import path and what it depends on (its tests aside).
func goList(t *testing.T, patterns ...string) map[string][]string {
	t.Helper()
	// go test puts its own go first in PATH.
	args := append([]string{"list", "-tags", "seccomp,runc_nocriu", "-f", `{{.ImportPath}} {{join .Deps " "}}`}, patterns...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps[f[0]] = f[1:]
	}
	return deps
}

// Only this package and the binary choose a backend: no other package of
// the module depends on runtime/runc or runtime/runsc (the runner takes
// the runtimes it is handed), but for the two backends themselves.
func TestOnlyComposeChoosesBackends(t *testing.T) {
	may := []string{module + "cmd/agentrun", module + "internal/compose", module + "runtime/runc", module + "runtime/runsc"}
	pkgs := goList(t, "../../...")
	if len(pkgs) < 30 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	for pkg, deps := range pkgs {
		if mayChoose(pkg, may) {
			continue
		}
		for _, dep := range deps {
			if dep == module+"runtime/runc" || dep == module+"runtime/runsc" {
				t.Errorf("%s depends on %s", pkg, dep)
			}
		}
	}
}

func mayChoose(pkg string, may []string) bool {
	for _, m := range may {
		if pkg == m || strings.HasPrefix(pkg, m+"/") {
			return true
		}
	}
	return false
}

// Doctor tries the machinery it is handed (Doctor): it links no runner,
// backend, libcontainer, netlink or namespace code of its own.
func TestDoctorWiresNoMachinery(t *testing.T) {
	banned := []string{
		"github.com/opencontainers/runc",
		"github.com/vishvananda/",
		module + "internal/runner",
		module + "runtime/runc",
		module + "runtime/runsc",
		module + "netns",
	}
	for _, dep := range goList(t, "../doctor")[module+"internal/doctor"] {
		for _, b := range banned {
			if dep == b || strings.HasPrefix(dep, strings.TrimSuffix(b, "/")+"/") {
				t.Errorf("internal/doctor depends on %s", dep)
			}
		}
	}
}
