// Package safefs is the host's one way into a directory tree a sandbox
// could write: a workspace, a session's disk, a display or hand-over
// directory, the files a program leaves for agentrun to read.
//
// A Dir is opened once on a directory the host made (its path is trusted);
// every name below it is resolved from that directory's descriptor with
// openat2(2) and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|
// RESOLVE_NO_XDEV, so a resolution never leaves the directory, never
// follows a symbolic link (at the leaf or in a middle component), never
// crosses a mount and never goes through /proc's magic links. On a kernel
// without openat2 (before 5.6) it walks the name a component at a time
// with openat(O_NOFOLLOW), refusing a link, a component that is not a
// directory and a change of device. A name is workspace-style: relative,
// with no "..".
//
// Files are created with O_EXCL (a planted link, fifo or file at the name
// is an error, never written through) and opened with O_NONBLOCK (a fifo
// never blocks the host); what is opened must be a regular file or a
// directory. os.Root and securejoin are not enough here: both follow links
// that stay inside the root, and a sandbox can swap what such a link names
// between two host steps.
//
// safefs must never resolve a name but from a Dir's descriptor, and never
// follow a link.
package safefs
