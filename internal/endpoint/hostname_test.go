package endpoint

import (
	"testing"

	"github.com/agentrun/agentrun/test/oracle"
)

// TestIsHostname: isHostname accepts exactly what the rule, as a regular
// expression, matches.
func TestIsHostname(t *testing.T) {
	cases := append([]string{"", ".", "a", "a.", ".a", "a..b", "a-b", "-a", "a-", "a.-b", "registry.internal", "127", "a_b", "a b", "é"},
		oracle.Random(5, 20000, 16, "aZ0-._ é")...)
	oracle.Match(t, "host", isHostname, `^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$`, cases)
}
