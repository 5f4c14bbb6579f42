// Package runner turns a validated task plan into a result: it fetches the
// image, sets up the run's sandbox (run dir and lock, rootfs, network,
// workspace, spec and the backend's prepared container) or takes one from
// the warm pool, runs the program on the plan's backend, collects files,
// and removes everything it made, on every path. It never asks which
// backend a run has: what differs between them is in their Traits. Nor
// does it choose them: New is handed the host's runtimes
// (backend.Runtime), which internal/compose makes.
//
// The set-up order of a sandbox is written once, in Runner.setup, for one
// request (a run's, or the pool's), each step pushing its undo on the
// sandbox's cleanup stack; the pool (Pool) makes its sandboxes with it,
// warm ones too (warm.go: the interpreter started ahead by agentrun's
// warm launcher, internal/launcher's, which the run hands over to). Runner.GC removes what
// dead runs left, by the protocol of package state. What the doors
// (serve, the worker, MCP) use of a runner is in package runapi.
package runner
