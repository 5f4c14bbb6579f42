package approvals

import "github.com/agentrun/agentrun/internal/untrusted"

// The ways an operator decides, as a decision's By names them
// (Operator): serve's API, the webhook's receiver through that API
// (unnamed, for a hold only the webhook announced), serve's approvals
// page, and a worker's NATS subject (`agentrun approve`).
const (
	ViaAPI     = "serve API"
	ViaWebhook = "webhook"
	ViaPage    = "page"
	ViaNATS    = "nats"
)

// MaxName bounds the name a decider gives itself (serve's API's "by",
// `agentrun approve --by`).
const MaxName = 64

// Operator is how a decision that an operator took through via is
// recorded: "operator (VIA)", or with the name the decider gave itself,
// "operator (VIA: NAME)". The name is the decider's own words: it is
// escaped (untrusted.Text) and kept under via's label, so that it never
// reads as another way's ("--by page" is not "operator (page)", the
// approvals page's label).
func Operator(via, name string) string {
	if name == "" {
		return "operator (" + via + ")"
	}
	return "operator (" + via + ": " + untrusted.Text(name) + ")"
}
