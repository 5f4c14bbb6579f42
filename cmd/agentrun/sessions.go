package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/runtime/spec"
)

const sessionsUsage = `usage: agentrun sessions [--config F] [--json] <command>
  new              create a session and print its id
  ls               list sessions
  rm ID            remove session ID (refused while it is in use)
  files ID         list the files of session ID
  cat ID PATH      print file PATH of session ID
  put ID PATH      write stdin to file PATH of session ID
  fork ID N        make N sessions (1 to 64), each a copy of session ID; print their ids
`

// sessionsCall is one call of a sessions subcommand: the store, the
// subcommand's arguments, and where it reads and writes.
type sessionsCall struct {
	st     *session.Store
	args   []string // after the subcommand's name
	stdin  io.Reader
	stdout io.Writer
	json   bool // --json
}

// sessionsCommands are the subcommands of sessions, by name: how many
// arguments each takes, and what runs it. A subcommand returns what
// --json prints, or nil when it has printed what it prints; or its
// failure (a usageError exits 2).
var sessionsCommands = map[string]sessionsCommand{
	"new":   {0, sessionsNew},
	"ls":    {0, sessionsList},
	"rm":    {1, sessionsRemove},
	"files": {1, sessionsFiles},
	"cat":   {2, sessionsCat},
	"put":   {2, sessionsPut},
	"fork":  {2, sessionsFork},
}

// sessionsCommand is a subcommand of sessions.
type sessionsCommand struct {
	args int // how many arguments it takes
	run  func(c *sessionsCall) (any, error)
}

// usageError is a subcommand's argument that does not parse.
type usageError struct{ error }

// cmdSessions manages kept session workspaces.
func cmdSessions(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sessions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (default "+config.DefaultPath+")")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, ok := parseInterspersed(fs, args)
	if !ok {
		return 2
	}
	var sub sessionsCommand
	if len(pos) > 0 {
		sub = sessionsCommands[pos[0]]
	}
	if sub.run == nil || sub.args != len(pos)-1 {
		fmt.Fprint(stderr, sessionsUsage)
		return 2
	}
	st, code := openSessions(*cfgPath, stderr)
	if st == nil {
		return code
	}
	out, err := sub.run(&sessionsCall{st: st, args: pos[1:], stdin: stdin, stdout: stdout, json: *asJSON})
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sessions %s: %v\n", pos[0], err)
		switch {
		case errors.As(err, new(usageError)):
			return 2
		case errkind.Of(err) == errkind.Busy:
			return 125
		}
		return 1
	}
	if out == nil {
		return 0
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return 1
	}
	return 0
}

// openSessions opens the session store of the config at cfgPath, as root;
// on failure it says why on stderr and returns the exit status.
func openSessions(cfgPath string, stderr io.Writer) (*session.Store, int) {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sessions: %v\n", err)
		return nil, 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "agentrun sessions: must run as root (sessions are disks it mounts)")
		return nil, 1
	}
	st, err := session.Open(cfg, spec.UID, spec.GID)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sessions: %v\n", err)
		return nil, 1
	}
	return st, 0
}

// sessionsNew creates a session and prints its id.
func sessionsNew(c *sessionsCall) (any, error) {
	id, err := c.st.Create()
	if err != nil || c.json {
		return map[string]string{"id": id}, err
	}
	fmt.Fprintln(c.stdout, id)
	return nil, nil
}

// sessionsList lists the sessions: id, last use, disk use, busy.
func sessionsList(c *sessionsCall) (any, error) {
	all, err := c.st.All()
	if err != nil || c.json {
		return all, err
	}
	for _, in := range all {
		busy := ""
		if in.Busy {
			busy = " busy"
		}
		fmt.Fprintf(c.stdout, "%s  last used %s  %d bytes on disk%s\n", in.ID, in.LastUsed.UTC().Format(time.RFC3339), in.DiskBytes, busy)
	}
	return nil, nil
}

// sessionsRemove removes a session.
func sessionsRemove(c *sessionsCall) (any, error) { return nil, c.st.Remove(c.args[0]) }

// sessionsFiles lists a session's files, their names escaped (printable).
func sessionsFiles(c *sessionsCall) (any, error) {
	l, err := c.st.Files(c.args[0])
	if err != nil || c.json {
		return l, err
	}
	for _, f := range l.Files {
		fmt.Fprintf(c.stdout, "%-7s %10d  %s  %s\n", f.Type, f.Size, f.MTime.Format(time.RFC3339), printable(f.Name))
	}
	if l.Truncated {
		fmt.Fprintf(c.stdout, "(listing cut at %d entries or %d levels)\n", session.MaxList, session.MaxListDepth)
	}
	return nil, nil
}

// sessionsCat writes a session's file to stdout, as it is.
func sessionsCat(c *sessionsCall) (any, error) {
	data, err := c.st.ReadFile(c.args[0], c.args[1])
	if err == nil {
		_, err = c.stdout.Write(data)
	}
	return nil, err
}

// sessionsPut writes stdin to a session's file.
func sessionsPut(c *sessionsCall) (any, error) {
	return nil, c.st.WriteFile(c.args[0], c.args[1], c.stdin)
}

// sessionsFork makes N copies of a session and prints their ids.
// Interrupted, a fork rolls back: no copy is left.
func sessionsFork(c *sessionsCall) (any, error) {
	n, err := strconv.Atoi(c.args[1])
	if err != nil {
		return nil, usageError{fmt.Errorf("count %q is not a number", c.args[1])}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f, err := c.st.Fork(ctx, c.args[0], n)
	if err != nil || c.json {
		return f, err
	}
	for _, id := range f.IDs {
		fmt.Fprintln(c.stdout, id)
	}
	return nil, nil
}

// printable is name as is, or quoted with every character that is not
// visible on its own escaped (untrusted.Text) when it holds one: a newline
// in a name must not make a second line of the listing, nor a variation
// selector or a filler hide a character of it.
func printable(name string) string {
	if esc := untrusted.Text(name); esc != name {
		return `"` + strings.ReplaceAll(esc, `"`, `\"`) + `"`
	}
	return name
}
