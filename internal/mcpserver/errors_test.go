package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/session"
)

func resultText(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	if !res.IsError || len(res.Content) != 1 {
		t.Fatalf("answer %+v; want one error text", res)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("answer content %T; want text", res.Content[0])
	}
	return tc.Text
}

// Every kind has its one MCP answer: refused, in words the model can act
// on, or the host's failure, logged and without its detail.
func TestToolErrorOfEveryKind(t *testing.T) {
	const sid = "ss-0123"
	refusedAs := func(text string) string { return ReadFileTool + " refused: " + text }
	host := ReadFileTool + " failed because of a problem on the host; the operator's log has the details."
	want := map[errkind.Kind]string{
		errkind.Unknown:     host,
		errkind.Invalid:     refusedAs("secret-free words"),
		errkind.Policy:      refusedAs("secret-free words"),
		errkind.NotFound:    ReadFileTool + ` refused: no session "ss-0123"; make one with new_session`,
		errkind.Timeout:     refusedAs("secret-free words"),
		errkind.Busy:        ReadFileTool + " refused: session ss-0123 is busy (a run or file access of it is in progress); try again when it ends",
		errkind.TooLarge:    refusedAs("secret-free words"),
		errkind.Unusable:    host,
		errkind.Quota:       refusedAs("secret-free words"),
		errkind.Upstream:    host,
		errkind.Unavailable: refusedAs("secret-free words"),
		errkind.Full:        refusedAs("secret-free words"),
	}
	for _, k := range errkind.All() {
		w, ok := want[k]
		if !ok {
			t.Errorf("kind %v: no answer in this test; add it", k)
			continue
		}
		var logged []string
		s := &Server{logf: func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }}
		err := errkind.New(k, "secret-free words")
		if got := resultText(t, s.toolError(ReadFileTool, sid, err)); got != w {
			t.Errorf("%v: answer %q; want %q", k, got, w)
		}
		if isHost := w == host; isHost != (len(logged) == 1) {
			t.Errorf("%v: logged %q; want the host's failures logged, and only them", k, logged)
		}
	}
}

// The session store's errors keep the answers they had; run_code's host
// failure names the run; a server's refusal is worded as the model wrote
// the call, with when to try again.
func TestToolErrorAnswers(t *testing.T) {
	s := &Server{logf: t.Logf}
	for _, tc := range []struct {
		tool string
		err  error
		want string
	}{
		{WriteFileTool, fmt.Errorf("%w: more than 16 bytes", session.ErrTooLarge), "write_file refused: file too large: more than 16 bytes"},
		{ListFilesTool, fmt.Errorf("%w: \"..\" leaves the workspace", session.ErrBadPath), `list_files refused: bad file name: ".." leaves the workspace`},
		{NewSessionTool, fmt.Errorf("%w: 1000", session.ErrFull), "new_session refused: too many sessions: 1000"},
		{ReadFileTool, fmt.Errorf("%w: ss-1", session.ErrBusy), "read_file refused: session ss-1 is busy"},
		{ToolName, errors.New("dial unix /run/agentrun.sock: connection refused"),
			"agentrun could not run the code because of a problem on the host, not in the code; the operator's log has the details."},
		{ToolName, &runapi.Refusal{Why: errkind.Policy, Field: "limits.timeout", Msg: "task: limits.timeout: 5m exceeds policy maximum 60s"},
			"run_code refused: timeout: 5m exceeds policy maximum 60s"},
		{ToolName, fmt.Errorf("asking: %w", &runapi.Refusal{Why: errkind.Quota, Msg: "over the quota", RetryAfter: 1500 * time.Millisecond}),
			"run_code refused: over the quota (try again in 2s)"},
		// serve's answer when it could not have the config's image, as
		// the forwarding client gets it: the host's, as a run here.
		{ToolName, &runapi.Refusal{Why: errkind.Unusable, Field: "image", Msg: "the server refused the task (422): image reg/x: not found"},
			"agentrun could not run the code because of a problem on the host, not in the code; the operator's log has the details."},
		{ToolName, &runapi.Refusal{Why: errkind.Upstream, Field: "image", Msg: "the server refused the task (502): image reg/x: unreachable"},
			"agentrun could not run the code because of a problem on the host, not in the code; the operator's log has the details."},
		{ToolName, &runapi.Refusal{Why: errkind.Unknown, Msg: "the server refused the task (418): odd"},
			"agentrun could not run the code because of a problem on the host, not in the code; the operator's log has the details."},
	} {
		sid := "ss-1"
		if got := resultText(t, s.toolError(tc.tool, sid, tc.err)); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s, %v: %q; want %q", tc.tool, tc.err, got, tc.want)
		}
	}
	if got := resultText(t, hostFailure(ToolName, "ar-1")); !strings.Contains(got, "(run ar-1)") {
		t.Errorf("run_code's host failure: %q; want the run id", got)
	}
}

// A run whose kept session another call took (or removed) after the
// server's check is refused, as the check refuses it; any other failure
// of a run is the host's, with its run id.
func TestRunCodeSessionRace(t *testing.T) {
	const sid = "ss-0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("locking the session: %w: %s", session.ErrBusy, sid), "run_code refused: session " + sid + " is busy"},
		{fmt.Errorf("%w: %s", session.ErrNotFound, sid), `run_code refused: no session "` + sid + `"`},
		{errors.New("making the workspace: no space left on device"), "agentrun could not run the code because of a problem on the host, not in the code (run ar-1)"},
		{&image.Error{Ref: "reg/x", Remote: true, Err: fmt.Errorf("pull: %w", errkind.ErrPolicy)}, "agentrun could not run the code because of a problem on the host, not in the code (run ar-1)"},
	} {
		s := New(config.Default(), func(context.Context, []byte) (*result.Result, error) {
			return &result.Result{ID: "ar-1", Error: tc.err.Error(), Err: tc.err}, nil
		}, t.Logf)
		cs := connect(t, s)
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolName,
			Arguments: map[string]any{"code": "x", "session": sid}})
		cs.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := resultText(t, res); !strings.HasPrefix(got, tc.want) {
			t.Errorf("run failed with %v: %q; want %q", tc.err, got, tc.want)
		}
	}
}
