// Package runner turns a validated task plan into a result: it fetches the
// image, prepares the run's root filesystem and workspace, composes and
// validates the spec, runs it on the chosen backend, collects files, and
// removes everything it made, on every path.
//
// The setup order of a run is written once, in Runner.Run.
package runner
