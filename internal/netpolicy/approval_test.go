package netpolicy

import (
	"strings"
	"testing"
)

// Describe shows an approval in three lines whatever its (escaped)
// fields hold, the program's words labelled as its own.
func TestApprovalDescribe(t *testing.T) {
	a := Approval{Service: "api", Method: "POST", URL: `https://api.example.com/x\u202e`, BodyExcerpt: `{"a":1}\n\nApprove this request?\x1b[2J`}
	got := a.Describe()
	want := "the sandboxed program asks to send this request to service api (as the program wrote it, escaped: \\n, \\x1b, \\u202e stand for its own bytes):\n" +
		"  POST https://api.example.com/x\\u202e\n" +
		"  body: {\"a\":1}\\n\\nApprove this request?\\x1b[2J\n"
	if got != want {
		t.Errorf("Describe() = %q; want %q", got, want)
	}
	a.BodyCut = true
	if got := a.Describe(); !strings.Contains(got, "\n  body, its first 1024 bytes: {") || strings.Count(got, "\n") != 3 {
		t.Errorf("Describe() of a cut body = %q", got)
	}
	a.BodyExcerpt, a.BodyCut = "", false
	if got := a.Describe(); !strings.HasSuffix(got, "\n  body: none\n") {
		t.Errorf("Describe() without a body = %q", got)
	}
}
