// Package backend defines what a sandbox backend is: the Backend interface
// (Prepare a container, then Exec its program once, then Destroy it; list
// and clean up what dead runs left), a run's Container and its Outcome,
// and what every backend shares to run one: the stdio pipes, the capped
// output capture, and the wait for the program under its timeout with the
// decoding of its exit status (Watch, Outcome.SetExit).
package backend
