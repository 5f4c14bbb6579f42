// Package doctor checks a host before anyone relies on it to run sandboxes:
// privileges, kernel features, cgroups, seccomp, filesystems, namespaces,
// runsc and agentrun's own directories. Each failed check says how to fix it.
// It also reports, as information, the host's own kernel exposure beyond
// any sandbox: user namespaces, unprivileged bpf, io_uring, modules.
//
// Doctor never leaves anything behind: what a check creates, it removes.
package doctor
