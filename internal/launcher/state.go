package launcher

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A run with keep_state starts with the globals of __main__ that the
// session's previous stateful run left and leaves its own (spec §11).
// The state is the program's bytes and stays inside the sandbox: the run
// launcher (agentrun_run.py) restores it before the code runs and saves it
// after, with agentrun_state.py (mounted read-only at StatePath), as the
// file StateFile of the session's own disk. agentrun never parses it; it
// tells the launcher what to do (a request at StateRequestPath, in the
// display directory) and reads back the launcher's report (at
// StateReportPath: ReadState), bounded and checked, as the program's
// words.
//
// The program can write anything the launcher can (they are one process),
// so the state a run leaves in its disk is only a candidate: the session's
// state is the host's copy (session.Lease.State), beside the session's
// disk, where no sandbox reaches. A stateful run gets that copy in its
// disk at StateFile before it starts, and the state it leaves there
// replaces it only when the launcher's report says that it saved one (a
// run killed, timed out or ended through os._exit never reports) and the
// file, opened without following a link, is a regular file within
// sessions.state_max_bytes by its size: a size, never a parse (the
// runner's stateIn and keepState). A program that writes the file and the report itself still
// leaves a state of its choosing within the cap: its own.

// StateFile is the state's file in the session's workspace, StateRel its
// path in the workspace, and StateRelDir its directory there, agentrun's.
const (
	StateRelDir = ".agentrun"
	StateRel    = StateRelDir + "/state"
	StateFile   = spec.WorkspaceDir + "/" + StateRel
)

// maxStateReport bounds the report agentrun reads; maxStateNames and
// maxStateText bound what of it the result keeps.
const (
	maxStateReport = 1 << 20
	maxStateNames  = 1000
	maxStateText   = 300
)

// StateRequest is what a run asks of its launcher about the state.
type StateRequest struct {
	keep, reset bool
	maxBytes    int64
}

// NewStateRequest is p's request, its state kept within maxBytes
// (sessions.state_max_bytes), or nil for a run without state.
func NewStateRequest(p *task.Plan, maxBytes int64) *StateRequest {
	if !p.KeepState && !p.ResetState {
		return nil
	}
	return &StateRequest{keep: p.KeepState, reset: p.ResetState, maxBytes: maxBytes}
}

// Write puts the request into the display directory display (the
// sandbox's): at set-up for a run that sets its sandbox up, at the take
// for one that takes a warm one, before its launcher goes on. A warm
// sandbox's code ran before the take and may have left something at the
// request's name (a link to a host file above all): that goes (the link
// itself, never what it names) and the request is made anew, exclusively;
// should the sandbox make the name again in between, the write fails.
func (q *StateRequest) Write(display *safefs.Dir) error {
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	line := fmt.Sprintf("keep=%d reset=%d max=%d file=%s\n", b(q.keep), b(q.reset), q.maxBytes, StateFile)
	if err := display.Remove(stateRequestFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing what the sandbox left at the state request's name: %w", err)
	}
	if err := display.WriteFile(stateRequestFile, []byte(line), 0o444); err != nil {
		return fmt.Errorf("writing the state request: %w", err)
	}
	return nil
}

// notSaved is the report of a stateful run that left none: it never
// reached its end.
const notSaved = "the run did not reach its end (killed, timed out, out of memory, or os._exit): the previous state stays"

// StateReport is what the launcher reported of the state: what the result
// says of it, and whether the state it saved is the one it restored
// (Unchanged: the session's stays as it is).
type StateReport struct {
	State     *result.State
	Unchanged bool
}

// ReadState reads the launcher's report from display.
// Anything but a report, or none, reads as not saved.
func ReadState(display *safefs.Dir) StateReport {
	st := &result.State{Kept: []string{}, Dropped: map[string]string{}, Reason: notSaved}
	if display == nil {
		return StateReport{State: st}
	}
	data, over := readChannelAt(display, stateReportFile, maxStateReport)
	if over || len(data) == 0 {
		return StateReport{State: st}
	}
	var rep struct {
		Kept      []string          `json:"kept"`
		Dropped   map[string]string `json:"dropped"`
		Bytes     int64             `json:"bytes"`
		Saved     bool              `json:"saved"`
		Unchanged bool              `json:"unchanged"`
		Reason    string            `json:"reason"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || rep.Bytes < 0 {
		st.Reason = "the launcher's report on the state is unreadable: the previous state stays"
		return StateReport{State: st}
	}
	for _, n := range rep.Kept {
		if len(st.Kept) < maxStateNames {
			st.Kept = append(st.Kept, text(n))
		}
	}
	for n, why := range rep.Dropped {
		if len(st.Dropped) < maxStateNames {
			st.Dropped[text(n)] = text(why)
		}
	}
	st.Bytes, st.Saved, st.Reason = rep.Bytes, rep.Saved, text(rep.Reason)
	return StateReport{State: st, Unchanged: rep.Saved && rep.Unchanged}
}

// text is the program's s as the result shows it: escaped, cut past
// maxStateText bytes.
func text(s string) string { return untrusted.Cut(untrusted.Text(s), maxStateText) }

// readChannelAt reads the file name of the display directory dir, which
// the program made: never through a link, never blocking on a FIFO, only
// a regular file (safefs), at most max bytes (over says it held more). A
// file that is not there, or not one to read, reads as empty.
func readChannelAt(dir *safefs.Dir, name string, max int64) (data []byte, over bool) {
	f, err := dir.Open(name)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, false
	}
	data, err = io.ReadAll(io.LimitReader(f, max+1))
	if err != nil || int64(len(data)) > max {
		// Larger than the tmpfs can be, or unreadable: what was read of
		// it is not kept.
		return nil, true
	}
	return data, false
}
