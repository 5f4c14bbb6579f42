// Package launcher is the host side of agentrun's Python launcher: the
// Python files a run's interpreter runs agentrun's code with (embedded,
// mounted read-only into the sandbox at the paths of paths.go), and what
// the host reads back of them. A Python run's value and display bundles
// come back through the display directory (display.go), a kept session's
// state is restored and saved by the launcher on the host's request
// (state.go), the run launcher's bytecode is made once per image and
// interpreter (code.go), and a warm sandbox's program is the warm
// launcher (agentrun_warm.py), which the pool starts ahead and the run
// hands over to. For answers what a sandbox needs of all this: its files'
// mounts, its display directory and the program's argv.
//
// The Python files are modules of their own, named as they are in the
// sandbox: agentrun_start (a cold or pooled run's program), agentrun_run
// (the run launcher: values, figures, state), agentrun_runlib (the rest
// of it, loaded at its first need), agentrun_state (a kept state),
// agentrun_warm (a warm sandbox's program) and agentrun_tools (what a run
// with tools imports). The launcher loads its own modules itself rather
// than through the task's sys.path, which stays as the task's interpreter
// makes it.
//
// The session side of a kept state (the host's copy put into the disk,
// and the disk's file adopted as the session's) is the runner's, and so
// is the warm pool's choice of which tasks run warm.
package launcher
