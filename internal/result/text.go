package result

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/agentrun/agentrun/internal/untrusted"
)

// WriteJSON writes r as JSON, indented, as the CLI prints a result.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r in its text form, as the CLI's --format text prints
// it: the program's stdout to out and its stderr to errw as
// it wrote them, escaped by untrusted.Lines (its lines kept, nothing else
// that could move, colour, reorder or hide text on a terminal), and a
// marker where a stream was cut at its cap. Then on errw: the summary,
// the collected files and the network denials, each on one line of its
// own with the names the program chose escaped by untrusted.Text, so
// that no name can start a line that reads as agentrun's; or, when
// agentrun could not run the task, the error alone.
func (r *Result) WriteText(out, errw io.Writer) error {
	for _, s := range []struct {
		w         io.Writer
		name      string
		data      []byte
		truncated bool
		total     int64
	}{
		{out, "stdout", r.RawStdout(), r.StdoutTruncated, r.StdoutBytes},
		{errw, "stderr", r.RawStderr(), r.StderrTruncated, r.StderrBytes},
	} {
		var b strings.Builder
		b.WriteString(untrusted.Lines(string(s.data)))
		if s.truncated {
			if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "[agentrun %s] %s truncated: %d of %d bytes kept\n", r.ID, s.name, len(s.data), s.total)
		}
		if _, err := io.WriteString(s.w, b.String()); err != nil {
			return err
		}
	}
	var b strings.Builder
	if r.Error != "" {
		fmt.Fprintf(&b, "agentrun: error: %s\n", untrusted.Text(strings.Join(strings.Fields(r.Error), " ")))
		_, err := io.WriteString(errw, b.String())
		return err
	}
	tag := "[agentrun " + r.ID + "]"
	fmt.Fprintf(&b, "%s %s\n", tag, r.summary())
	for _, name := range slices.Sorted(maps.Keys(r.Files)) {
		f := r.Files[name]
		fmt.Fprintf(&b, "%s file %s: %d bytes", tag, untrusted.Text(name), f.Size)
		if f.Truncated {
			b.WriteString(", truncated")
		}
		if f.Error != "" {
			b.WriteString(", not returned: " + untrusted.Text(f.Error))
		}
		b.WriteString("\n")
	}
	for _, d := range r.Network.Denied {
		fmt.Fprintf(&b, "%s network denied %s:%d: %s", tag, untrusted.Text(d.Host), d.Port, d.Reason)
		if d.Count > 1 {
			fmt.Fprintf(&b, " (%d times)", d.Count)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(errw, b.String())
	return err
}

// summary is r's outcome and usage on one line.
func (r *Result) summary() string {
	var parts []string
	switch {
	case r.TimedOut:
		parts = append(parts, "timed out")
	case r.OOMKilled:
		parts = append(parts, "killed: out of memory")
	case r.Signal != "":
		parts = append(parts, "killed by "+r.Signal)
	default:
		parts = append(parts, fmt.Sprintf("exit %d", r.ExitCode))
	}
	parts = append(parts, fmt.Sprintf("%d ms", r.DurationMS), fmt.Sprintf("cpu %d ms", r.CPUMS),
		fmt.Sprintf("peak %.1f MiB", float64(r.MemoryPeakBytes)/(1<<20)))
	if n := len(r.Network.Allowed); n > 0 {
		parts = append(parts, fmt.Sprintf("%d allowed destinations", n))
	}
	if r.Network.None {
		parts = append(parts, "no network")
	}
	return strings.Join(parts, ", ")
}
