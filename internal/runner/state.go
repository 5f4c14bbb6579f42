package runner

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A run with keep_state starts with the globals of __main__ that the
// session's previous stateful run left and leaves its own (spec §11).
// The state is the program's bytes and stays inside the sandbox: the run
// launcher (run.py) restores it before the code runs and saves it after,
// with state.py (mounted read-only at StatePath), as the file StateFile of
// the session's own disk, so that it is the session's data: counted in
// its size, forked and removed with it. agentrun never reads it; it tells
// the launcher what to do (a request file in the display directory) and
// reads back the launcher's report (StateReport there), bounded and
// checked, as the program's words.

//go:embed state.py
var stateModule []byte

// StatePath is where state.py is mounted in a stateful run's sandbox.
const StatePath = "/dev/agentrun-state.py"

const stateModuleName = "agentrun-state.py"

// StateFile is the state's file in the session's workspace.
const StateFile = spec.WorkspaceDir + "/.agentrun/state"

// The request to the launcher and its report, in the display directory.
const (
	stateRequestFile = "state-request"
	stateReportFile  = "state"
)

// maxStateReport bounds the report agentrun reads; maxStateNames and
// maxStateText bound what of it the result keeps.
const (
	maxStateReport = 1 << 20
	maxStateNames  = 1000
	maxStateText   = 300
)

// stateRequest is what a run asks of its launcher about the state.
type stateRequest struct {
	keep, reset bool
	maxBytes    int64
}

// newStateRequest is p's request, or nil for a run without state.
func newStateRequest(p *task.Plan, cfg *config.Config) *stateRequest {
	if !p.KeepState && !p.ResetState {
		return nil
	}
	return &stateRequest{keep: p.KeepState, reset: p.ResetState, maxBytes: cfg.Sessions.StateBytes()}
}

// stateModuleOpt puts state.py into the run's etc tmpfs of run dir dir
// and returns the spec option that mounts it: every run with state gets
// it, and every warm sandbox, which a stateful run may take.
func stateModuleOpt(dir string, undo *cleanup.Cleanup) (spec.SpecOpt, error) {
	module, err := writeEtc(dir, undo, stateModuleName, stateModule)
	if err != nil {
		return nil, fmt.Errorf("writing the state module: %w", err)
	}
	return spec.WithReadonlyFile(module, StatePath), nil
}

// write puts the request into the display directory display (the
// sandbox's): at set-up for a run that sets its sandbox up, at the take
// for one that takes a warm one, before its launcher goes on. A warm
// sandbox's code ran before the take and may have left something at the
// request's name (a link to a host file above all): that goes (the link
// itself, never what it names) and the request is made anew, exclusively;
// should the sandbox make the name again in between, the write fails.
func (q *stateRequest) write(display *safefs.Dir) error {
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

// readState reads the launcher's report from display: what the result
// says of the state. Anything but a report, or none, reads as not saved.
func readState(display *safefs.Dir) *result.State {
	st := &result.State{Kept: []string{}, Dropped: map[string]string{}, Reason: notSaved}
	if display == nil {
		return st
	}
	data, over := readChannelAt(display, stateReportFile, maxStateReport)
	if over || len(data) == 0 {
		return st
	}
	var rep struct {
		Kept    []string          `json:"kept"`
		Dropped map[string]string `json:"dropped"`
		Bytes   int64             `json:"bytes"`
		Saved   bool              `json:"saved"`
		Reason  string            `json:"reason"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || rep.Bytes < 0 {
		st.Reason = "the launcher's report on the state is unreadable: the previous state stays"
		return st
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
	return st
}

// text is the program's s as the result shows it: escaped, cut past
// maxStateText bytes.
func text(s string) string { return untrusted.Cut(untrusted.Text(s), maxStateText) }
