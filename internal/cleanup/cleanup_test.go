package cleanup

import (
	"errors"
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
