package escape

import (
	"strings"
	"testing"
)

// A probe that dies mid-way leaves one finished probe per line: the harness
// still reads those and says the report is incomplete.
func TestParseReportTruncated(t *testing.T) {
	full := "{\"version\":1,\"probes\":[\n" +
		`{"id":"a","item":1,"blocked":true,"control_ok":true},` + "\n" +
		`{"id":"b","item":2,"blocked":false,"control_ok":true}` + "\n]}\n"
	ps, complete := parseReport(full)
	if !complete || len(ps) != 2 || ps[1].ID != "b" || ps[1].Blocked {
		t.Fatalf("full report: %+v complete %v", ps, complete)
	}
	cut := full[:strings.Index(full, `{"id":"b"`)+10]
	ps, complete = parseReport(cut)
	if complete || len(ps) != 1 || ps[0].ID != "a" {
		t.Fatalf("truncated report: %+v complete %v", ps, complete)
	}
}

func TestMarkdownFlagsHoles(t *testing.T) {
	md := markdown("libcontainer", []Probe{
		{ID: "x", Item: 3, Name: "a | b", Blocked: false, ControlOK: true, Detail: "succeeded"},
		{ID: "y", Item: 1, Name: "c", Blocked: true, ControlOK: false, Errno: "EPERM"},
	}, nil)
	for _, want := range []string{"**NOT BLOCKED**", "**failed**", `a \| b`, "2 probes: 0 blocked"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Index(md, "`y`") > strings.Index(md, "`x`") {
		t.Error("rows are not ordered by checklist item")
	}
}
