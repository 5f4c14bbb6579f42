// Package runsc runs sandbox containers with gVisor's runsc, as a child
// process, so that the program talks to gVisor's user-space kernel instead of
// the host's.
//
// Each run gets an OCI bundle in the backend's state dir and a cgroup that
// agentrun creates and limits itself (runtime/cgroup); runsc puts the whole sandbox (sentry,
// gofer and their helpers) inside it, so the memory, cpu and pids limits
// cover all of it, and agentrun reads usage and OOM kills from it.
//
// The backend never leaves a runsc process, cgroup, bundle or runsc state
// behind once Run returns, and never passes task text through a shell.
package runsc
