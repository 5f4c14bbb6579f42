package approvals

import "testing"

// A decision is recorded under the way it came, and a name the decider
// gave itself under that way's label, escaped: no name reads as another
// way's label, nor draws anything on a terminal.
func TestOperator(t *testing.T) {
	for _, tc := range []struct{ via, name, want string }{
		{ViaAPI, "", "operator (serve API)"},
		{ViaWebhook, "", "operator (webhook)"},
		{ViaPage, "", "operator (page)"},
		{ViaNATS, "", "operator (nats)"},
		{ViaAPI, "page", "operator (serve API: page)"},
		{ViaNATS, "alice\n\x1b[2J\u202e", `operator (nats: alice\n\x1b[2J\u202e)`},
	} {
		if got := Operator(tc.via, tc.name); got != tc.want {
			t.Errorf("Operator(%q, %q) = %q; want %q", tc.via, tc.name, got, tc.want)
		}
	}
}
