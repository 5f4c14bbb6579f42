package launcher

import (
	"testing"

	"github.com/agentrun/agentrun/test/oracle"
)

// TestIsPythonName: isPythonName accepts exactly what the rule's regular
// expression matches.
func TestIsPythonName(t *testing.T) {
	cases := append([]string{"", "python", "python3", "python3.11", "python3.", "python.3", "python3.11.2", "python3a",
		"pythonx", "Python3", "python 3", "ipython3", "python3\n", "python33.1"},
		oracle.Random(1, 20000, 12, "python3.1 x")...)
	oracle.Match(t, "python name", isPythonName, `^python([0-9]+(\.[0-9]+)?)?$`, cases)
}
