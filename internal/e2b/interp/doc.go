// Package interp is the E2B door's code interpreter (spec §18): what
// @e2b/code-interpreter reaches on a sandbox's port 49999 (POST /execute
// and its stream of messages, the contexts), answered by agentrun on the
// host. A context is an interpreter kept alive inside the live sandbox
// for its life, as a Jupyter kernel is: agentrun's REPL launcher
// (internal/launcher's agentrun_repl.py, in every live sandbox read-only)
// run by the image's python3 as a process exec'd into the sandbox
// (runapi.Sandbox.Exec) with its stdin kept open, every restriction of
// the sandbox on it. Cells go to it as JSON lines on its stdin; its
// frames come back as JSON lines on its stdout, while the code's own
// stdout and stderr are pipes it relays as frames, so nothing the code
// prints reads as a frame. Every frame is hostile: bounded (MaxFrame),
// read as plain JSON with no key twice (jsonkeys), its results counted
// (MaxResults), and nothing else deserialised. Values and figures are
// the run launcher's (spec §12). A bash context is the image's bash,
// its cells marked by the context's random token (bash.go).
package interp
