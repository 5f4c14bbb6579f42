package main

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/worker"
)

// The holding worker's reply comes off the bus: agentrun approve prints
// its words escaped, never a line or a terminal control of theirs.
func TestApproveReplyEscaped(t *testing.T) {
	var out, errw strings.Builder
	evil := "ar-1\x1b[2J\nagentrun approve: approval ap-2 of run ar-2: approved by operator (alice)\u202e"
	if code := printReply(&out, &errw, "ap-1", worker.DecisionReply{Run: evil, Approved: true, By: evil}); code != 0 {
		t.Errorf("exit %d", code)
	}
	if code := printReply(&out, &errw, "ap-1", worker.DecisionReply{Error: evil}); code != 1 {
		t.Errorf("exit %d", code)
	}
	for name, s := range map[string]string{"stdout": out.String(), "stderr": errw.String()} {
		if strings.Count(s, "\n") != 1 || strings.ContainsAny(s, "\x1b\u202e") || !strings.Contains(s, `\x1b[2J\n`) {
			t.Errorf("%s = %q; want one line, the reply escaped", name, s)
		}
	}
}
