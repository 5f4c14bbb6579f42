// Package doctor checks a host before anyone relies on it to run sandboxes:
// privileges, kernel features, cgroups, seccomp, filesystems, namespaces,
// runsc and agentrun's own directories. Each failed check says how to fix it.
//
// Doctor never leaves anything behind: what a check creates, it removes.
package doctor
