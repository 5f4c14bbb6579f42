package config

import (
	"strings"
	"testing"

	"github.com/agentrun/agentrun/test/oracle"
)

// TestNames: each name check accepts exactly what its regular expression
// (the rule as the errors state it) matches.
func TestNames(t *testing.T) {
	cases := append([]string{"", "a", "A", "0", "_", "-", ".", "+", "a.b", "a..b", ".a", "a.", "_a", "-a", "0a", "aB", "Ab",
		"a b", "a\n", "\na", "a\x00", "é", "a/b", "*", ">", strings.Repeat("a", 62), strings.Repeat("a", 63),
		strings.Repeat("a", 64), strings.Repeat("a", 65), "python3", "my-svc_1"},
		oracle.Random(1, 20000, 70, "aZ09_-.+ \n/é*")...)
	oracle.Match(t, "env", isEnvName, `^[A-Za-z_][A-Za-z0-9_]*$`, cases)
	oracle.Match(t, "language", isLanguageName, `^[A-Za-z0-9._+-]{1,64}$`, cases)
	oracle.Match(t, "service", isServiceName, `^[a-z0-9][a-z0-9_-]{0,62}$`, cases)
	oracle.Match(t, "nats name", isNATSName, `^[A-Za-z0-9_-]{1,64}$`, cases)
	oracle.Match(t, "nats subject", isNATSSubject, `^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, cases)
	oracle.Match(t, "python module", isPythonModule, `^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`, cases)
}
