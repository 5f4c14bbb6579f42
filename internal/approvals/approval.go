package approvals

import (
	"context"
	"fmt"
	"time"

	"github.com/agentrun/agentrun/internal/untrusted"
)

// DefaultTimeout is how long a held request or tool call waits for a
// decision when the config does not say (network.approval_timeout's
// default).
const DefaultTimeout = 60 * time.Second

// BodyExcerptBytes is how much of a held request's body the approver
// sees.
const BodyExcerptBytes = 1024

// Approval is a request held until someone decides: what the approver is
// shown.
//
// Method, URL and BodyExcerpt are the program's bytes, already escaped by
// untrusted.Text: no control character (newline included), no
// bidirectional or zero-width format character, no variation selector,
// filler or other character that is not visible on its own, and no
// invalid UTF-8, each written as a visible escape (\n, \x1b, \u202e,
// \ufe0f). They are safe to show
// as text as they are, and every channel shows the same text: a channel
// must not quote or escape them again, and labels them as the program's
// own words (as Describe does). URL is whole (origin, path and query, at
// most the proxy's MaxURLBytes).
type Approval struct {
	ID          string `json:"id"`
	Service     string `json:"service"`
	Method      string `json:"method"`
	URL         string `json:"url"`
	BodyExcerpt string `json:"body_excerpt"`
	// BodyCut is set when the body is longer than the excerpt, which
	// then holds its first BodyExcerptBytes only.
	BodyCut bool `json:"body_cut,omitempty"`

	// Kind is "" for a held HTTP request and KindTool for a held tool
	// call (spec §13): then Service is the tool server's name, Tool the
	// tool's name and Arguments the call's arguments as JSON, both the
	// program's bytes escaped as above and whole (a call whose arguments
	// are longer than MaxArgumentsShown, or hold a key twice in an
	// object, is refused before anyone is asked); Method, URL and
	// BodyExcerpt are empty.
	Kind      string `json:"kind,omitempty"`
	Tool      string `json:"tool,omitempty"`
	Arguments string `json:"arguments,omitempty"`
}

// KindTool is the Kind of a held tool call.
const KindTool = "tool"

// MaxArgumentsShown is the longest escaped arguments of a held tool call
// shown to a human; a longer call is refused before asking.
const MaxArgumentsShown = 4096

// Request is the Approval of a request to service: method and url as the
// proxy shows and records them, escaped already (untrusted.Text), and
// the start of its body, of which the approver is shown the first
// BodyExcerptBytes, escaped, and told when there is more (BodyCut). The
// proxy gives it its ID.
func Request(service, method, url string, body []byte) Approval {
	excerpt := body[:min(len(body), BodyExcerptBytes)]
	return Approval{Service: service, Method: method, URL: url,
		BodyExcerpt: untrusted.Text(string(excerpt)), BodyCut: len(body) > BodyExcerptBytes}
}

// ToolCall is the Approval, under a fresh id, of a call to tool of tool
// server server with args (JSON): the tool's name and the arguments
// escaped (untrusted.Text) and whole. It is an error when either is
// longer escaped than MaxArgumentsShown: the call could not be shown
// whole, and is refused before anyone is asked.
func ToolCall(server, tool string, args []byte) (Approval, error) {
	a := Approval{ID: NewID(), Kind: KindTool, Service: server, Tool: untrusted.Text(tool), Arguments: untrusted.Text(string(args))}
	if len(a.Arguments) > MaxArgumentsShown || len(a.Tool) > MaxArgumentsShown {
		return Approval{}, fmt.Errorf("arguments too long to show: %d bytes escaped, more than the %d an approver is shown whole", len(a.Arguments), MaxArgumentsShown)
	}
	return a, nil
}

// Describe is the held request for a human, in lines that each end in a
// newline, the program's words labelled as its own: which service it asks
// to send to, then the method and URL, then the body (its start when
// BodyCut); for a held tool call (KindTool), the tool server, then the
// tool's name and the arguments, each on a line of its own under its label,
// whole. Every channel that asks a human shows this text.
func (a Approval) Describe() string {
	if a.Kind == KindTool {
		args := a.Arguments
		if args == "" {
			args = "none"
		}
		return "the sandboxed program asks to call a tool of tool server " + a.Service +
			" (the tool's name and arguments as the program wrote them, escaped: \\n, \\x1b, \\u202e stand for its own bytes):\n" +
			"  tool: " + a.Tool + "\n" +
			"  arguments: " + args + "\n"
	}
	body := "  body: none\n"
	switch {
	case a.BodyCut:
		body = fmt.Sprintf("  body, its first %d bytes: %s\n", BodyExcerptBytes, a.BodyExcerpt)
	case a.BodyExcerpt != "":
		body = "  body: " + a.BodyExcerpt + "\n"
	}
	return "the sandboxed program asks to send this request to service " + a.Service +
		" (as the program wrote it, escaped: \\n, \\x1b, \\u202e stand for its own bytes):\n" +
		"  " + a.Method + " " + a.URL + "\n" + body
}

// Noun is what a's channel asks about: "tool call" for a held tool call,
// "request" for a held request.
func (a Approval) Noun() string {
	if a.Kind == KindTool {
		return "tool call"
	}
	return "request"
}

// Decision is an approver's answer and who or what gave it.
type Decision struct {
	Approved bool
	By       string // such as "operator (serve)", "mcp client", "terminal"
	// Taken says that whoever decided was told, before ctx ended, that the
	// decision was taken (serve's API and page answer 200, a worker
	// replies over NATS): it counts even when the approver returns after
	// ctx ended, so that the record says what the decider was told.
	Taken bool
}

// Func asks for a decision on a held request or tool call: the proxy's
// and the tool broker's approver. It must return when ctx ends (the
// approval timed out, or the request was abandoned); its answer then no
// longer counts, unless it is Taken.
type Func func(ctx context.Context, a Approval) Decision

// RunFunc is a Func for the holds of any run, told which: the approver a
// door or the terminal hands the runner (runapi.Hooks.Approve), which
// makes it the Func of each run.
type RunFunc func(ctx context.Context, run string, a Approval) Decision
