package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/agentrun/agentrun/internal/config"
)

// loadConfig parses the flags of command name, which takes --config and no
// arguments, and loads the config. When it returns nil it has said why on
// stderr, and the command exits with code (2 for usage, 1 for the config).
func loadConfig(name string, args []string, stderr io.Writer) (cfg *config.Config, code int) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (default "+config.DefaultPath+")")
	if err := fs.Parse(args); err != nil {
		return nil, 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "agentrun %s: no arguments expected\n", name)
		return nil, 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun %s: %v\n", name, err)
		return nil, 1
	}
	return cfg, 0
}

// configPath is the --config of serve's args ("" for the default), which
// loadConfig has already parsed.
func configPath(args []string) string {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	p := fs.String("config", "", "")
	_ = fs.Parse(args)
	return *p
}
