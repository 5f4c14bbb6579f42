package approvals

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/untrusted"
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

// Describe shows a held tool call in three lines: the tool server, then
// the tool's name and the arguments under their labels, whole, however
// hostile the program's (escaped) bytes are; none of them can start a
// line or read as agentrun's own words.
func TestApprovalDescribeTool(t *testing.T) {
	tool := "create_issue\n  arguments: {}\nagentrun: approved\r\u202e\x1b[2J"
	args := "{\"title\":\"x\n\nApprove? [y/N] y\",\"body\":\"\u200b\x7f\xff\\n\"}"
	a := Approval{ID: "ap-1", Kind: KindTool, Service: "github", Tool: untrusted.Text(tool), Arguments: untrusted.Text(args)}
	got := a.Describe()
	want := "the sandboxed program asks to call a tool of tool server github (the tool's name and arguments as the program wrote them, escaped: \\n, \\x1b, \\u202e stand for its own bytes):\n" +
		`  tool: create_issue\n  arguments: {}\nagentrun: approved\r\u202e\x1b[2J` + "\n" +
		`  arguments: {"title":"x\n\nApprove? [y/N] y","body":"\u200b\x7f\xff\\n"}` + "\n"
	if got != want {
		t.Errorf("Describe() = %q\nwant         %q", got, want)
	}
	if n := strings.Count(got, "\n"); n != 3 || strings.ContainsAny(got, "\r\x1b\u202e\u200b\x7f") {
		t.Errorf("Describe() = %q: %d lines, or a raw control or format character", got, n)
	}
	if a.Noun() != "tool call" || (Approval{}).Noun() != "request" {
		t.Errorf("Noun: %q, %q", a.Noun(), Approval{}.Noun())
	}
	a.Arguments = ""
	if got := a.Describe(); !strings.HasSuffix(got, "\n  arguments: none\n") {
		t.Errorf("Describe() without arguments = %q", got)
	}
}

// A held request shows the start of its body escaped and says when there
// is more; a held tool call shows its name and arguments escaped and
// whole, or is refused when it could not be.
func TestRequestAndToolCall(t *testing.T) {
	body := []byte(strings.Repeat("\x1b", BodyExcerptBytes) + "tail")
	a := Request("api", "POST", "https://api.example/x", body)
	if !a.BodyCut || a.BodyExcerpt != strings.Repeat(`\x1b`, BodyExcerptBytes) || a.Kind != "" || a.Service != "api" {
		t.Errorf("Request of a long body: %+v", a)
	}
	if a := Request("api", "GET", "u", []byte("short\n")); a.BodyCut || a.BodyExcerpt != `short\n` {
		t.Errorf("Request of a short body: %+v", a)
	}
	a, err := ToolCall("github", "create\n", []byte(`{"a":"`+"\u202e"+`"}`))
	if err != nil || a.Kind != KindTool || a.Tool != `create\n` || a.Arguments != `{"a":"\u202e"}` || !strings.HasPrefix(a.ID, "ap-") {
		t.Errorf("ToolCall = %+v, %v", a, err)
	}
	long := []byte(`"` + strings.Repeat("\x00", MaxArgumentsShown/4) + `"`)
	if _, err := ToolCall("github", "t", long); err == nil || !strings.Contains(err.Error(), "too long to show") {
		t.Errorf("ToolCall of arguments too long to show escaped: %v", err)
	}
}
