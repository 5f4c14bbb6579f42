package task

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/names"
	"github.com/agentrun/agentrun/test/oracle"
)

// TestNames: the task's name checks accept exactly what their rules, as
// regular expressions, match.
func TestNames(t *testing.T) {
	cases := []string{"", "a", "ss-", "ss-" + strings.Repeat("a", 32), "ss-" + strings.Repeat("A", 32), "ss-" + strings.Repeat("0", 31),
		"ss-" + strings.Repeat("f", 33), "SS-" + strings.Repeat("a", 32), "a:b", "a b", "a\n", "a/b", "-", "_", "é"}
	cases = append(cases, oracle.Random(3, 10000, 20, "aZ09._:- /\né")...)
	for _, hex := range oracle.Random(4, 10000, 34, "0123456789abcdefgA-") {
		cases = append(cases, "ss-"+hex)
	}
	oracle.Match(t, "session", func(s string) bool { return names.Only(s, "._:-") }, `^[A-Za-z0-9._:-]*$`, cases)
	oracle.Match(t, "kept session", IsKeptSessionID, `^ss-[0-9a-f]{32}$`, cases)
	oracle.Match(t, "id", func(s string) bool { return CheckID(s) == nil }, `^[A-Za-z0-9_-]+$`, cases)
}
