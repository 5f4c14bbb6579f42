package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/compose"
)

// cmdGC removes what agentrun processes that died left behind, and then
// the runtimes' shared parent cgroups where they are empty (runs keep
// them).
func cmdGC(args []string, stdout, stderr io.Writer) int {
	cfg, code := loadConfig("gc", args, stderr)
	if cfg == nil {
		return code
	}
	r, err := compose.Runner(cfg, nil)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun gc: %v\n", err)
		return 1
	}
	cleaned, err := r.GC()
	err = errors.Join(err, r.RemoveCgroupParents())
	for _, id := range cleaned {
		fmt.Fprintf(stdout, "removed %s\n", id)
	}
	if err != nil {
		fmt.Fprintf(stderr, "agentrun gc: %v\n", err)
		return 1
	}
	return 0
}
