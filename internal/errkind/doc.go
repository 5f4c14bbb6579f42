// Package errkind is the one set of error kinds agentrun's doors answer
// by: what a failure means to the one who asked (their request is bad,
// policy refuses it, what it names does not exist or is in use, the host
// has no room now, an upstream failed), so that serve's HTTP statuses, the
// MCP tools' answers, the worker's retries and the CLI's exit codes decide
// the same way. The packages that make the errors (task, image, session,
// the server's admission) mark them with a kind where they are made; each
// door maps a kind to its answer in one place.
//
// A kind never says how a failure is shown: its message stays the error's
// own. An error that no one marked is Unknown: a failure of the host.
//
// The set is agentrun's own rather than containerd's errdefs: errdefs
// follows gRPC's codes, in which an oversized task, a session quota and a
// full session store are all ResourceExhausted and a malformed task and an
// image that cannot run are both InvalidArgument, while agentrun's API
// tells each apart (413, 429, 507; 400, 422) and has an upstream that
// failed (502), which errdefs has no kind for. The mechanism is errdefs':
// sentinel errors made with New, wrapped with context by fmt.Errorf's %w,
// and told apart with Of (or errors.Is against the sentinel).
package errkind
