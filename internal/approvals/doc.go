// Package approvals is what a hold is, for the requests to services that
// the proxy holds and the tool calls that the tool broker holds alike
// (spec §5.2, §13): the held request or call (Approval, escaped as
// Request and ToolCall make it) and its text for a human (Describe), the
// decision and who took it (Decision, Operator), how the holder waits for
// it within the approval timeout and how the wait ended (Ask), the holds
// waiting in one process and the last decisions (Pending), the first
// decision taken (Slot), the question on a terminal (Terminal), the JSON
// a webhook gets (Hold) and the webhook that announces it (Webhook).
//
// The doors only carry a hold: serve's stream, API and page, MCP's
// elicitation, a worker's NATS subject, the terminal. Every one of them
// shows the same escaped text and none escapes it again.
package approvals
