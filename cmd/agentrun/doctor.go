package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/doctor"
)

// cmdDoctor checks the host and prints a table; it exits 1 if a run would fail.
func cmdDoctor(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (default "+config.DefaultPath+")")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun doctor: %v\n", err)
		return 1
	}
	checks := doctor.Run(context.Background(), cfg)
	doctor.Print(stdout, checks)
	if doctor.Failed(checks) {
		fmt.Fprintln(stdout, "\nagentrun cannot run sandboxes on this host until the failures above are fixed.")
		return 1
	}
	return 0
}
