package main

import (
	"flag"
	"io"
	"slices"
	"testing"
)

// The sandbox's shape flags make its request: --session its kept
// session, each --tool a tool server, each --allow a host.
func TestSandboxFlags(t *testing.T) {
	fs := flag.NewFlagSet("sandbox create", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := addSandboxFlags(fs)
	err := fs.Parse([]string{"--image", "busybox", "--session", "ss-0123", "--tool", "github", "--tool", "docs", "--allow", "pypi.org", "--timeout", "10m"})
	if err != nil {
		t.Fatal(err)
	}
	req, err := f.request()
	if err != nil {
		t.Fatal(err)
	}
	if req.Image != "busybox" || req.Session != "ss-0123" || !slices.Equal(req.Tools, []string{"github", "docs"}) ||
		!slices.Equal(req.Network.Allow, []string{"pypi.org"}) || req.Timeout.String() != "10m" {
		t.Errorf("request %+v", req)
	}
}
