package image

import (
	"go/build"
	"slices"
	"testing"
)

// Production packages never import testing or the test helpers.
func TestNoTestDependencies(t *testing.T) {
	for _, dir := range []string{".", "unpack"} {
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range []string{"testing", "github.com/agentrun/agentrun/image/imagetest", "net/http/httptest"} {
			if slices.Contains(pkg.Imports, bad) {
				t.Errorf("package %s imports %s", pkg.ImportPath, bad)
			}
		}
	}
}

// image checks registry addresses with netpolicy.CheckAddr, never through
// the proxy and its namespaces.
func TestNoProxyDependency(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"github.com/agentrun/agentrun/proxy", "github.com/agentrun/agentrun/netns"} {
		if slices.Contains(pkg.Imports, bad) {
			t.Errorf("package %s imports %s", pkg.ImportPath, bad)
		}
	}
}
