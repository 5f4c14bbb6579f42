// Package result defines the JSON result of a run and maps it to agentrun's
// process exit status (spec section 3).
package result
