package main

import (
	"context"
	"encoding/json"
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
	want := map[string]int{"new": 1, "ls": 1, "rm": 2, "files": 2, "cat": 3, "put": 3, "fork": 3}
	if len(pos) == 0 || want[pos[0]] != len(pos) {
		fmt.Fprint(stderr, sessionsUsage)
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sessions: %v\n", err)
		return 1
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "agentrun sessions: must run as root (sessions are disks it mounts)")
		return 1
	}
	st, err := session.Open(cfg, spec.UID, spec.GID)
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sessions: %v\n", err)
		return 1
	}
	var out any
	switch pos[0] {
	case "new":
		var id string
		if id, err = st.Create(); err == nil {
			out = map[string]string{"id": id}
			if !*asJSON {
				fmt.Fprintln(stdout, id)
				return 0
			}
		}
	case "ls":
		var all []session.Info
		if all, err = st.All(); err == nil {
			out = all
			if !*asJSON {
				for _, in := range all {
					busy := ""
					if in.Busy {
						busy = " busy"
					}
					fmt.Fprintf(stdout, "%s  last used %s  %d bytes on disk%s\n", in.ID, in.LastUsed.UTC().Format(time.RFC3339), in.DiskBytes, busy)
				}
				return 0
			}
		}
	case "rm":
		if err = st.Remove(pos[1]); err == nil {
			return 0
		}
	case "files":
		var l *session.Listing
		if l, err = st.Files(pos[1]); err == nil {
			out = l
			if !*asJSON {
				for _, f := range l.Files {
					fmt.Fprintf(stdout, "%-7s %10d  %s  %s\n", f.Type, f.Size, f.MTime.Format(time.RFC3339), printable(f.Name))
				}
				if l.Truncated {
					fmt.Fprintf(stdout, "(listing cut at %d entries or %d levels)\n", session.MaxList, session.MaxListDepth)
				}
				return 0
			}
		}
	case "cat":
		var data []byte
		if data, err = st.ReadFile(pos[1], pos[2]); err == nil {
			_, err = stdout.Write(data)
			if err == nil {
				return 0
			}
		}
	case "put":
		if err = st.WriteFile(pos[1], pos[2], stdin); err == nil {
			return 0
		}
	case "fork":
		n, convErr := strconv.Atoi(pos[2])
		if convErr != nil {
			fmt.Fprintf(stderr, "agentrun sessions fork: count %q is not a number\n", pos[2])
			return 2
		}
		// Interrupted, a fork rolls back: no copy is left.
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		var f *session.Forked
		if f, err = st.Fork(ctx, pos[1], n); err == nil {
			out = f
			if !*asJSON {
				for _, id := range f.IDs {
					fmt.Fprintln(stdout, id)
				}
				return 0
			}
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "agentrun sessions %s: %v\n", pos[0], err)
		if errkind.Of(err) == errkind.Busy {
			return 125
		}
		return 1
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return 1
	}
	return 0
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
