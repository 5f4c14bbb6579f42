package approvals

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/untrusted"
)

// fakeTTY is a terminal: the test types on in and reads what is asked
// from out.
type fakeTTY struct {
	io.Reader
	io.Writer
}

func newFakeTTY(t *testing.T) (tty fakeTTY, in io.WriteCloser, out *bufio.Reader) {
	t.Helper()
	ir, iw := io.Pipe()
	or, ow := io.Pipe()
	t.Cleanup(func() { iw.Close(); ow.Close() })
	return fakeTTY{ir, ow}, iw, bufio.NewReader(or)
}

// readUntil reads what the terminal shows up to and including s, and
// returns it.
func readUntil(t *testing.T, out *bufio.Reader, s string) string {
	t.Helper()
	var got strings.Builder
	for !strings.HasSuffix(got.String(), s) {
		b, err := out.ReadByte()
		if err != nil {
			t.Fatalf("terminal showed %q, then %v; want %q", got.String(), err, s)
		}
		got.WriteByte(b)
	}
	return got.String()
}

// A request whose time runs out while another's question waits on the
// terminal is denied then, not once the other is answered; an answer in
// time counts as given.
func TestTerminalApproverTurns(t *testing.T) {
	tty, in, out := newFakeTTY(t)
	ask := Terminal(tty)
	first := make(chan Decision, 1)
	go func() {
		first <- ask(context.Background(), "ar-1", Approval{ID: "ap-1", Service: "api", Method: "POST", URL: "https://a/1"})
	}()
	readUntil(t, out, "Approve? [y/N] ")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	second := make(chan Decision, 1)
	go func() {
		second <- ask(ctx, "ar-1", Approval{ID: "ap-2", Service: "api", Method: "POST", URL: "https://a/2"})
	}()
	select {
	case d := <-second:
		if d.Approved || d.Taken {
			t.Errorf("second, timed out waiting for its turn: %+v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second request still waiting after its time ran out, behind the first's question")
	}
	io.WriteString(in, "y\n")
	if d := <-first; !d.Approved || !d.Taken || d.By != "terminal" {
		t.Errorf("first, answered y: %+v", d)
	}
}

// An answer read after the time ran out does not count, and the terminal
// says so.
func TestTerminalApproverLateAnswer(t *testing.T) {
	tty, in, out := newFakeTTY(t)
	ask := Terminal(tty)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Decision, 1)
	go func() {
		got <- ask(ctx, "ar-1", Approval{ID: "ap-1", Service: "api", Method: "POST", URL: "https://a/1"})
	}()
	readUntil(t, out, "Approve? [y/N] ")
	cancel()
	go io.WriteString(in, "y\n")
	readUntil(t, out, "no answer in time: denied\n")
	if d := <-got; d.Approved || d.Taken {
		t.Errorf("late answer: %+v", d)
	}
}

// A held tool call is asked on the terminal as Describe shows it: the
// tool server, then the program's tool and arguments under their labels,
// as their escapes, so that no line of its own reads as agentrun's; "y"
// approves it.
func TestTerminalApproverToolCall(t *testing.T) {
	tty, in, out := newFakeTTY(t)
	ask := Terminal(tty)
	a := Approval{ID: "ap-t", Kind: KindTool, Service: "github",
		Tool: untrusted.Text("create_issue\nagentrun: no answer in time: denied\r"), Arguments: untrusted.Text("{\"x\":\"\x1b]0;owned\x07\u202e\"}")}
	got := make(chan Decision, 1)
	go func() { got <- ask(context.Background(), "ar-1", a) }()
	shown := readUntil(t, out, "Approve? [y/N] ")
	want := "\nagentrun: run ar-1: the sandboxed program asks to call a tool of tool server github " +
		"(the tool's name and arguments as the program wrote them, escaped: \\n, \\x1b, \\u202e stand for its own bytes):\n" +
		`  tool: create_issue\nagentrun: no answer in time: denied\r` + "\n" +
		`  arguments: {"x":"\x1b]0;owned\x07\u202e"}` + "\n" +
		"Approve? [y/N] "
	if shown != want {
		t.Errorf("terminal showed %q\nwant           %q", shown, want)
	}
	io.WriteString(in, "y\n")
	if d := <-got; !d.Approved || !d.Taken || d.By != "terminal" {
		t.Errorf("answered y: %+v", d)
	}
}
