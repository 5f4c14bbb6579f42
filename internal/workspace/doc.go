// Package workspace makes a run's /workspace: a size-capped tmpfs on the
// host, filled with the task's files before the run and read back (collect)
// after it.
//
// Every path inside a workspace is resolved through internal/safefs: the
// workspace never follows a link, in it or out of it, and collect never opens
// anything but a regular file.
package workspace
