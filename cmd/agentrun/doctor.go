package main

import (
	"context"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/compose"
	"github.com/agentrun/agentrun/internal/doctor"
)

// cmdDoctor checks the host and prints a table; it exits 1 if a run would fail.
func cmdDoctor(args []string, stdout, stderr io.Writer) int {
	cfg, code := loadConfig("doctor", args, stderr)
	if cfg == nil {
		return code
	}
	checks := doctor.Run(context.Background(), cfg, compose.Doctor{})
	doctor.Print(stdout, checks)
	if doctor.Failed(checks) {
		fmt.Fprintln(stdout, "\nagentrun cannot run sandboxes on this host until the failures above are fixed.")
		return 1
	}
	return 0
}
