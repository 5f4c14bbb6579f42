package netpolicy

import (
	"go/build"
	"strings"
	"testing"
)

// netpolicy is a leaf: the task, config, image, proxy and result share it,
// so it imports none of them, nor anything that touches a namespace.
func TestLeaf(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"golang.org/x/text/unicode/norm":                  true,
		"github.com/agentrun/agentrun/internal/untrusted": true,
	}
	for _, imp := range pkg.Imports {
		if strings.Contains(imp, ".") && !allowed[imp] {
			t.Errorf("package netpolicy imports %s; want only the standard library, x/text's norm and internal/untrusted", imp)
		}
	}
}
