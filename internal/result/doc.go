// Package result defines the JSON result of a run, its text form (text.go:
// what `agentrun run --format text` prints, everything the program chose
// escaped) and maps it to agentrun's process exit status
// (docs/task-and-result.md).
package result
