// Package backend defines what a sandbox backend is given and gives back:
// the Backend interface, a run's Container and its Outcome, and the stdio
// pipes and capped output capture that every backend shares.
package backend
