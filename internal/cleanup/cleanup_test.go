package cleanup

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestCleanRunsEveryStepLastFirst(t *testing.T) {
	var got []int
	var c Cleanup
	c.Add(func() error { got = append(got, 1); return errors.New("one") })
	c.Add(func() error { got = append(got, 2); return nil })
	c.Add(func() error { got = append(got, 3); return errors.New("three") })
	err := c.Clean()
	if !slices.Equal(got, []int{3, 2, 1}) {
		t.Errorf("steps ran as %v; want 3 2 1", got)
	}
	if err == nil || err.Error() != "three\none" {
		t.Errorf("Clean = %v; want both failures", err)
	}
	if err := c.Clean(); err != nil || len(got) != 3 {
		t.Errorf("a second Clean ran steps again (%v, %v)", got, err)
	}
}

// TestCleanTo: CleanTo runs the steps above its mark, last first, and
// leaves those below for Clean.
func TestCleanTo(t *testing.T) {
	var c Cleanup
	var ran []int
	for i := range 4 {
		c.Add(func() error { ran = append(ran, i); return nil })
		if i == 1 {
			if c.Len() != 2 {
				t.Fatalf("Len %d; want 2", c.Len())
			}
		}
	}
	if err := c.CleanTo(2); err != nil || c.Len() != 2 {
		t.Fatalf("CleanTo: %v, Len %d", err, c.Len())
	}
	if err := c.CleanTo(5); err != nil || c.Len() != 2 {
		t.Fatalf("CleanTo past the stack: %v, Len %d", err, c.Len())
	}
	if err := c.Clean(); err != nil || c.Len() != 0 {
		t.Fatalf("Clean: %v, Len %d", err, c.Len())
	}
	if fmt.Sprint(ran) != "[3 2 1 0]" {
		t.Errorf("ran %v; want [3 2 1 0]", ran)
	}
}
