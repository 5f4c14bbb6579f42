// Package mcpserver is agentrun's Model Context Protocol server: the tool
// run_code, over stdio (`agentrun mcp`) and Streamable HTTP (serve's /mcp),
// built on the official Go SDK.
//
// A call becomes a task.json and goes through the same door as any other
// run (task parsing, policy, admission, quotas, runner, audit record); the
// answer is written for a model to read. It never shows the model a
// host-side error: that goes to the operator's log and the audit record,
// and the model gets a generic text with the run id.
package mcpserver
