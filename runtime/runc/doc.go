// Package runc runs sandbox containers in-process with runc's libcontainer.
//
// A binary that uses this package must call InitHook first thing (from an
// init function of package main, or of a test package): libcontainer
// re-executes the binary as the container's init process.
//
// The backend never leaves a process, cgroup or state directory behind once
// Destroy returns. libcontainer creates and destroys the container's cgroup
// with its own manager; the backend kills what runs in it, reads its usage
// and removes what is left of it through runtime/cgroup.
//
// The sandbox's seccomp filter is compiled once per process by
// libcontainer's own code and loaded in each sandbox by agentrun-seccomp
// (seccomp.go), not compiled in every container's init.
package runc
