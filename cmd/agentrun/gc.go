package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/runner"
)

// cmdGC removes what agentrun processes that died left behind.
func cmdGC(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (default "+config.DefaultPath+")")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun gc: %v\n", err)
		return 1
	}
	r, err := runner.New(cfg, nil)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun gc: %v\n", err)
		return 1
	}
	cleaned, err := r.GC()
	for _, id := range cleaned {
		fmt.Fprintf(stdout, "removed %s\n", id)
	}
	if err != nil {
		fmt.Fprintf(stderr, "agentrun gc: %v\n", err)
		return 1
	}
	return 0
}
