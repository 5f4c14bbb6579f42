// Package audit appends one JSON record per run, and one per live
// sandbox as it ends, to the audit log.
//
// A record never holds the program's output or the task's code: only what
// identifies the run and what it was allowed and did.
package audit
