package audit

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/untrusted"
)

// Bounds of one record.
const (
	// MaxRecordBytes bounds one record's line, newline included.
	MaxRecordBytes = 64 << 10
	// maxText bounds the error and the detail.
	maxText = 4 << 10
	// maxName bounds each collected file name, host and denial reason.
	maxName = 256
	// maxPath bounds each service request's path and approval's URL,
	// cut with a mark and the whole's SHA-256 (untrusted.Cut).
	maxPath = 512
	// maxCommand bounds a process's command, its words escaped.
	maxCommand = 1 << 10
)

// Truncation says what a record left out to stay within MaxRecordBytes:
// the full length of each list it cut.
type Truncation struct {
	Files          int `json:"files,omitempty"`
	NetworkAllowed int `json:"network_allowed,omitempty"`
	NetworkDenied  int `json:"network_denied,omitempty"`
	NetworkAllow   int `json:"network_allow,omitempty"`
	NetworkFailed  int `json:"network_failed,omitempty"`
	// NetworkRequests and NetworkApprovals: the service requests and the
	// approvals.
	NetworkRequests  int `json:"network_requests,omitempty"`
	NetworkApprovals int `json:"network_approvals,omitempty"`
	// ToolCalls: the tool calls (those a person decided kept first).
	ToolCalls int `json:"tool_calls,omitempty"`
	// Processes: a live sandbox's processes listed.
	Processes int `json:"processes,omitempty"`
}

// CommandOf is argv as a record lists it: each word escaped with
// untrusted.Text, the words kept while they add up to at most about
// maxCommand bytes, the one that passes it cut with a mark and its
// SHA-256 (untrusted.Cut), the rest left out; words is len(argv) when
// some were left out, else 0.
func CommandOf(argv []string) (cmd []string, words int) {
	left := maxCommand
	for i, w := range argv {
		e := untrusted.Text(w)
		if len(e) > left {
			cmd = append(cmd, untrusted.Cut(e, left))
			if i+1 < len(argv) {
				words = len(argv)
			}
			return cmd, words
		}
		cmd = append(cmd, e)
		left -= len(e)
	}
	return cmd, 0
}

// marshalBounded encodes rec as one line of at most MaxRecordBytes: long
// texts and names are cut (a service request's path and an approval's URL
// with a mark and the SHA-256 of the whole), and then the lists (collected
// files, network decisions, service requests and approvals, the
// allowlist) are halved until the line fits, the record saying how long
// each list was. The approvals a person decided (approved, or Taken) are
// kept before the others, so that a program's flood of requests refused
// at once cannot cut a decision of a person out of the record. rec itself
// is not changed.
func marshalBounded(rec *Record) ([]byte, error) {
	line, err := json.Marshal(rec)
	if err != nil || len(line)+1 <= MaxRecordBytes {
		return append(line, '\n'), err
	}
	r := *rec
	r.Error, r.Detail = cut(r.Error, maxText), cut(r.Detail, maxText)
	r.Files = slices.Clone(r.Files)
	slices.Sort(r.Files)
	for i := range r.Files {
		r.Files[i] = cut(r.Files[i], maxName)
	}
	r.Network.Allowed = slices.Clone(r.Network.Allowed)
	for i := range r.Network.Allowed {
		r.Network.Allowed[i].Host = cut(r.Network.Allowed[i].Host, maxName)
	}
	r.Network.Denied = slices.Clone(r.Network.Denied)
	for i := range r.Network.Denied {
		d := &r.Network.Denied[i]
		d.Host, d.Reason = cut(d.Host, maxName), cut(d.Reason, maxName)
	}
	r.Network.Failed = slices.Clone(r.Network.Failed)
	for i := range r.Network.Failed {
		f := &r.Network.Failed[i]
		f.Host, f.Reason = cut(f.Host, maxName), cut(f.Reason, maxName)
	}
	r.Network.Requests = slices.Clone(r.Network.Requests)
	for i := range r.Network.Requests {
		q := &r.Network.Requests[i]
		q.Method, q.Path, q.Reason = untrusted.Cut(q.Method, maxName), untrusted.Cut(q.Path, maxPath), cut(q.Reason, maxName)
	}
	r.Network.Approvals = slices.Clone(r.Network.Approvals)
	for i := range r.Network.Approvals {
		a := &r.Network.Approvals[i]
		a.Method, a.URL = untrusted.Cut(a.Method, maxName), untrusted.Cut(a.URL, maxPath)
	}
	r.Limits.NetworkAllow = slices.Clone(r.Limits.NetworkAllow)
	for i := range r.Limits.NetworkAllow {
		r.Limits.NetworkAllow[i] = cut(r.Limits.NetworkAllow[i], maxName)
	}
	var calls []result.ToolCall
	if r.Tools != nil {
		tools := *r.Tools
		tools.Calls = slices.Clone(tools.Calls)
		for i := range tools.Calls {
			c := &tools.Calls[i]
			c.Tool, c.Reason = untrusted.Cut(c.Tool, maxName), cut(c.Reason, maxName)
		}
		r.Tools = &tools
		calls = tools.Calls
	}
	r.Processes = slices.Clone(r.Processes)
	t := &Truncation{}
	for {
		line, err = json.Marshal(&r)
		if err != nil || len(line)+1 <= MaxRecordBytes {
			return append(line, '\n'), err
		}
		n := &r.Network
		if len(r.Files)+len(n.Allowed)+len(n.Denied)+len(n.Failed)+len(n.Requests)+len(n.Approvals)+len(r.Limits.NetworkAllow)+len(calls)+len(r.Processes) == 0 {
			return nil, fmt.Errorf("audit record of %d bytes even with its lists emptied", len(line))
		}
		r.Truncated = t
		r.Files = halve(r.Files, &t.Files)
		n.Allowed = halve(n.Allowed, &t.NetworkAllowed)
		n.Denied = halve(n.Denied, &t.NetworkDenied)
		n.Failed = halve(n.Failed, &t.NetworkFailed)
		n.Requests = halve(n.Requests, &t.NetworkRequests)
		n.Approvals = halveKeeping(n.Approvals, &t.NetworkApprovals, decidedByPerson)
		r.Limits.NetworkAllow = halve(r.Limits.NetworkAllow, &t.NetworkAllow)
		r.Processes = halve(r.Processes, &t.Processes)
		if r.Tools != nil {
			calls = halveKeeping(calls, &t.ToolCalls, func(c result.ToolCall) bool { return c.By != "" })
			r.Tools.Calls = calls
		}
	}
}

// halve drops the second half of s, noting its full length in *total the
// first time.
func halve[T any](s []T, total *int) []T {
	if len(s) == 0 {
		return s
	}
	if *total == 0 {
		*total = len(s)
	}
	return s[:len(s)/2]
}

// halveKeeping halves s as halve does, but drops the elements that keep
// does not hold for first: those it holds for are kept before any other,
// in their order, and the others fill the rest of the half.
func halveKeeping[T any](s []T, total *int, keep func(T) bool) []T {
	if len(s) == 0 {
		return s
	}
	if *total == 0 {
		*total = len(s)
	}
	n, kept := len(s)/2, 0
	for _, e := range s {
		if keep(e) {
			kept++
		}
	}
	others := max(n-kept, 0)
	out := make([]T, 0, n)
	for _, e := range s {
		if len(out) == n {
			break
		}
		switch {
		case keep(e):
			out = append(out, e)
		case others > 0:
			out = append(out, e)
			others--
		}
	}
	return out
}

// decidedByPerson says whether a was decided by a person: approved, or
// a decision its decider was told was taken.
func decidedByPerson(a result.Approval) bool { return a.Approved || a.Taken }

// cut shortens s to at most n bytes (on a rune boundary), saying so.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = "…(cut)"
	i := n - len(more)
	for i > 0 && s[i]&0xC0 == 0x80 {
		i--
	}
	return s[:i] + more
}
