package mcpserver

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// toolError is tool's answer to err, by err's kind: the one place where
// errkind's kinds become MCP answers. What the model can act on is
// refused, naming what is wrong: a session unknown (and how to make one)
// or busy (and when to try again); a request malformed, above policy, too
// large, over a quota or the store's bound, or the host busy, in the
// error's own words. Anything else is the host's (unmarked, an upstream
// that failed, an image of the config that cannot run): logged, and
// answered without its detail. A *runapi.Refusal is the server's own
// refusal of a task, already worded: refused, unless its kind is the
// host's, as when serve could not have the config's image, so that a
// call forwarded to serve is answered as one run here.
func (s *Server) toolError(tool, session string, err error) *mcp.CallToolResult {
	kind := errkind.Of(err)
	var ref *runapi.Refusal
	switch {
	case hostKind(kind):
		s.logf("%s (session %s): %v", tool, session, err)
		return hostFailure(tool, "")
	case errors.As(err, &ref):
		return refused(tool, ref)
	case kind == errkind.NotFound:
		return errorResult(fmt.Sprintf("%s refused: no session %q; make one with %s", tool, session, NewSessionTool))
	case kind == errkind.Busy:
		return errorResult(fmt.Sprintf("%s refused: session %s is busy (a run or file access of it is in progress); try again when it ends", tool, session))
	}
	return errorResult(tool + " refused: " + err.Error())
}

// hostKind reports whether a failure of kind k is the host's, never the
// model's to fix: unmarked, an upstream that failed, or an image (the
// config's, for run_code) that cannot run.
func hostKind(k errkind.Kind) bool {
	return k == errkind.Unknown || k == errkind.Upstream || k == errkind.Unusable
}

// refused is the answer to a refused task: what is wrong, named as the
// model wrote it, so that it can fix the call.
func refused(tool string, ref *runapi.Refusal) *mcp.CallToolResult {
	msg := strings.TrimPrefix(ref.Msg, "task: ")
	for _, n := range argNames {
		msg = strings.ReplaceAll(msg, n.field, n.arg)
	}
	text := tool + " refused: " + msg
	if ref.RetryAfter > 0 {
		text += fmt.Sprintf(" (try again in %s)", ref.RetryAfter.Round(time.Second))
	}
	return errorResult(text)
}

// hostFailure is tool's answer when agentrun itself failed: nothing of
// the host's detail, only the run id (if any) the operator can look up.
func hostFailure(tool, id string) *mcp.CallToolResult {
	if tool != ToolName {
		return errorResult(tool + " failed because of a problem on the host; the operator's log has the details.")
	}
	text := "agentrun could not run the code because of a problem on the host, not in the code"
	if id != "" {
		text += " (run " + id + ")"
	}
	return errorResult(text + "; the operator's log has the details.")
}

// cancelled is the answer to a call the client cancelled (or left): its
// run was killed.
func cancelled() *mcp.CallToolResult {
	return errorResult("run_code cancelled: the run was stopped")
}

func errorResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
