// Package workspace makes a run's /workspace: a size-capped tmpfs on the
// host, filled with the task's files before the run and read back (collect)
// after it.
//
// Every path inside a workspace is resolved through os.Root: the workspace
// never follows a link out of itself, and collect never opens anything but a
// regular file.
package workspace
