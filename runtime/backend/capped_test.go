package backend

import "testing"

// TestCappedBuffer: writes past Max are taken and dropped.
func TestCappedBuffer(t *testing.T) {
	c := &CappedBuffer{Max: 5}
	for _, w := range []string{"abc", "defg", "hij"} {
		if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", w, n, err)
		}
	}
	if got := c.String(); got != "abcde" {
		t.Errorf("kept %q, want %q", got, "abcde")
	}
}
