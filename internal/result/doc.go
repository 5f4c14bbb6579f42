// Package result defines the JSON result of a run and maps it to agentrun's
// process exit status (docs/task-and-result.md).
package result
