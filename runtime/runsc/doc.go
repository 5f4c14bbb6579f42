// Package runsc runs sandbox containers with gVisor's runsc, as child
// processes, so that the program talks to gVisor's user-space kernel instead
// of the host's.
//
// Each run gets an OCI bundle in the backend's state dir and a cgroup that
// agentrun creates and limits itself (runtime/cgroup); runsc puts the whole sandbox (sentry,
// gofer and their helpers) inside it, so the memory, cpu and pids limits
// cover all of it, and agentrun reads usage and OOM kills from it.
//
// A run has the backend's two steps: Prepare boots the sandbox and creates
// its container (`runsc create`, which hands the program's stdio to the
// sandbox), so that a pool can hold it; Exec starts the program (`runsc
// start`) and waits for its exit status (`runsc wait`), killing everything
// in the cgroup at the timeout. Destroy removes the sandbox (`runsc delete
// --force`), the cgroup, the bundle and runsc's state. A created sandbox
// outlives the runsc command that made it: if agentrun dies, gc finds its
// bundle and removes it all the same way.
//
// The backend never passes task text through a shell.
package runsc
