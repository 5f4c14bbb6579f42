// Package cgroup is one run's cgroup, on a cgroup v1 host (hybrid or not)
// and on a cgroup v2 host, through containerd/cgroups: it creates the
// cgroup with its memory, cpu and pids limits for a backend that makes its
// own (runsc), or opens one another made (libcontainer's, or one a dead
// agentrun left); it kills everything in it, frozen so that nothing forks
// past the kill; it reads its cpu time, peak memory and OOM kills; and it
// removes it, child cgroups first, and the backend's shared parent once
// that is empty.
//
// A run's cgroup has the same path in every hierarchy: in each mounted v1
// hierarchy and, on a hybrid host, in the unified one too (libcontainer
// joins it there); on a v2 host in the one unified hierarchy. This is the
// package's only contact with the cgroup file systems; libcontainer keeps
// its own cgroup manager for the containers it creates and destroys.
package cgroup
