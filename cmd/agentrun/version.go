package main

import (
	"fmt"
	"io"
	"runtime/debug"
)

// Set at link time by the Makefile (-X): the release, the commit (Go's
// own VCS stamp, when there is one, comes first), and the gVisor release
// test/runsc.sh installs, the one agentrun is tested with.
var (
	version      = ""
	commit       = ""
	runscVersion = ""
)

// cmdVersion prints agentrun's version, the commit it was built from and
// the versions of the runtimes it was built with, from the build info.
func cmdVersion(args []string, stdout, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintln(stderr, "agentrun version: no arguments expected")
		return 2
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		fmt.Fprintln(stderr, "agentrun version: the binary carries no build info")
		return 1
	}
	v, rev, libcontainer := bi.Main.Version, commit, "unknown"
	if version != "" {
		v = version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				rev += " (modified)"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/opencontainers/runc" {
			libcontainer = d.Version
			if d.Replace != nil {
				libcontainer = d.Replace.Path + " " + d.Replace.Version
			}
		}
	}
	runsc := runscVersion
	if runsc == "" {
		runsc = "unknown"
	}
	fmt.Fprintf(stdout, "agentrun %s\ncommit: %s\ngo: %s\nlibcontainer: %s (github.com/opencontainers/runc)\nrunsc: gvisor.dev/gvisor %s (tested with; runsc is a separate binary)\n",
		v, rev, bi.GoVersion, libcontainer, runsc)
	return 0
}
