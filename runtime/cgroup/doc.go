// Package cgroup is one run's cgroup, on a cgroup v1 host (hybrid or not)
// and on a cgroup v2 host: it creates the cgroup with its memory, cpu and
// pids limits for a backend that makes its own (runsc), or opens one
// another made (libcontainer's, or one a dead agentrun left); it kills
// everything in it, frozen so that nothing forks past the kill; it reads
// its cpu time, peak memory and OOM kills; and it removes it, child
// cgroups first, and a shared parent (a backend's, which its runs keep,
// or the tool servers') where that is empty.
//
// The host's cgroup mode and the creation with limits are
// opencontainers/cgroups', the library libcontainer manages its own
// containers' cgroups with; the v1 OOM notification is the kernel's
// eventfd registration. The kill, the usage and the removal work on the
// cgroup's files directly: every wait in them is bounded (the library's
// freeze retries for up to 10 s on a task that cannot be frozen), and the
// usage reads only the files a run reports.
//
// A run's cgroup has the same path in every hierarchy: in each mounted v1
// hierarchy and, on a hybrid host, in the unified one too (libcontainer
// joins it there); on a v2 host in the one unified hierarchy.
package cgroup
