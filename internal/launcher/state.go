package runner

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/safefs"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/internal/workspace"
	"github.com/agentrun/agentrun/runtime/spec"
)

// A run with keep_state starts with the globals of __main__ that the
// session's previous stateful run left and leaves its own (spec §11).
// The state is the program's bytes and stays inside the sandbox: the run
// launcher (run.py) restores it before the code runs and saves it after,
// with state.py (mounted read-only at StatePath), as the file StateFile of
// the session's own disk. agentrun never parses it; it tells the launcher
// what to do (a request file in the display directory) and reads back the
// launcher's report (StateReport there), bounded and checked, as the
// program's words.
//
// The program can write anything the launcher can (they are one process),
// so the state a run leaves in its disk is only a candidate: the session's
// state is the host's copy (session.Lease.State), beside the session's
// disk, where no sandbox reaches. A stateful run gets that copy in its
// disk at StateFile before it starts (stateIn), and the state it leaves
// there replaces it only when the launcher's report says that it saved
// one (a run killed, timed out or ended through os._exit never reports)
// and the file, opened without following a link, is a regular file within
// sessions.state_max_bytes by its size (keepState): a size, never a
// parse. A program that writes the file and the report itself still
// leaves a state of its choosing within the cap: its own.

//go:embed state.py
var stateModule []byte

// StatePath is where state.py is mounted in a stateful run's sandbox.
const StatePath = "/dev/agentrun-state.py"

const stateModuleName = "agentrun-state.py"

// StateFile is the state's file in the session's workspace.
const StateFile = spec.WorkspaceDir + "/" + stateDir + "/" + stateName

// The directory of StateFile in the workspace, and its name there.
const (
	stateDir  = ".agentrun"
	stateName = "state"
)

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

// stateReport is what the launcher reported of the state: what the result
// says of it, and whether the state it saved is the one it restored
// (unchanged: the session's stays as it is).
type stateReport struct {
	state     *result.State
	unchanged bool
}

// readState reads the launcher's report from display.
// Anything but a report, or none, reads as not saved.
func readState(display *safefs.Dir) stateReport {
	st := &result.State{Kept: []string{}, Dropped: map[string]string{}, Reason: notSaved}
	if display == nil {
		return stateReport{state: st}
	}
	data, over := readChannelAt(display, stateReportFile, maxStateReport)
	if over || len(data) == 0 {
		return stateReport{state: st}
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
		return stateReport{state: st}
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
	return stateReport{state: st, unchanged: rep.Saved && rep.Unchanged}
}

// stateIn puts the kept state of the session of lease into its disk,
// ws, at StateFile, for the launcher of a run of p with keep_state to
// restore; with reset_state it removes the session's state first. A
// session without a state gets none there: whatever a program left at
// StateFile is removed, never restored.
func stateIn(ws *workspace.Workspace, lease *session.Lease, p *task.Plan) error {
	if !p.KeepState && !p.ResetState {
		return nil
	}
	if p.ResetState {
		if err := lease.ResetState(); err != nil {
			return err
		}
	}
	rel := stateDir + "/" + stateName
	if ws.RemoveAll(rel) != nil {
		// Something of the program's in the way (a file or a link for
		// the directory): the directory is agentrun's.
		if err := ws.RemoveAll(stateDir); err != nil {
			return fmt.Errorf("removing the state from the session's disk: %w", err)
		}
	}
	if !p.KeepState || p.ResetState {
		return nil
	}
	f, err := lease.State()
	if err != nil || f == nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading the session's state: %w", err)
	}
	put := func() error {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return fmt.Errorf("reading the session's state: %w", err)
		}
		return ws.WriteFrom(rel, f, fi.Size(), spec.UID, spec.GID)
	}
	err = put()
	if err != nil && !errors.Is(err, workspace.ErrNoRoom) {
		// Something of the program's in the way of the state's
		// directory (a file, a link): the directory is agentrun's.
		if ws.RemoveAll(stateDir) == nil {
			err = put()
		}
	}
	if err != nil {
		return fmt.Errorf("putting the session's state in its disk: %w", err)
	}
	return nil
}

// keepState makes the state that the run in sb left in its session's
// disk the session's, where the launcher's report rep says that it saved
// one: once the file at StateFile, opened without following a link and
// without blocking, is a regular file of at most max bytes, by its size,
// and read whole without its size changing meanwhile (what the sandbox
// still runs may write). It returns what the result says of the state,
// and whether a state was kept.
func keepState(sb *sandbox, rep stateReport, max int64) (*result.State, bool) {
	st := rep.state
	if !st.Saved || rep.unchanged || sb.lease == nil {
		return st, false
	}
	n, err := adoptState(sb.ws, sb.lease, max)
	if err != nil {
		st.Saved, st.Reason = false, fmt.Sprintf("the state was not kept (%v): the previous state stays", err)
		return st, false
	}
	st.Bytes = n
	return st, true
}

// adoptState copies StateFile of ws into the session's state, checked as
// keepState says, and returns its size.
func adoptState(ws *workspace.Workspace, lease *session.Lease, max int64) (int64, error) {
	f, err := ws.OpenRegular(stateDir + "/" + stateName)
	if err != nil {
		return 0, fmt.Errorf("the launcher's state file cannot be read: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if size > max {
		return 0, fmt.Errorf("%d bytes, more than sessions.state_max_bytes (%d)", size, max)
	}
	w, err := lease.NewState()
	if err != nil {
		return 0, err
	}
	defer w.Abort()
	// At most size bytes are read, and size bytes must be there.
	if n, err := io.Copy(w, io.NewSectionReader(f, 0, size)); err != nil || n != size {
		return 0, fmt.Errorf("copying the state: %d bytes of %d (%v)", n, size, err)
	}
	if after, err := f.Stat(); err != nil || after.Size() != size || !after.ModTime().Equal(fi.ModTime()) {
		return 0, errors.New("the state file changed while it was copied")
	}
	if err := w.Commit(); err != nil {
		return 0, err
	}
	return size, nil
}

// text is the program's s as the result shows it: escaped, cut past
// maxStateText bytes.
func text(s string) string { return untrusted.Cut(untrusted.Text(s), maxStateText) }
