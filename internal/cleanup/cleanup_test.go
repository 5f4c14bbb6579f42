package cleanup

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
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

// TestAddBeside: a step added beside runs at once beside the steps above
// its mark, and every step below the mark waits for it; its error is
// joined with the others.
func TestAddBeside(t *testing.T) {
	var c Cleanup
	var mu sync.Mutex
	var ran []string
	log := func(s string) {
		mu.Lock()
		ran = append(ran, s)
		mu.Unlock()
	}
	c.Add(func() error { log("below"); return nil })
	mark := c.Len()
	beside := make(chan struct{})
	c.Add(func() error { <-beside; log("beside 1"); return nil }) // waits for the beside step's start
	c.Add(func() error { log("beside 2"); return nil })
	release := make(chan struct{})
	c.AddBeside(mark, func() error {
		close(beside)
		select {
		case <-release: // the steps beside it have run
		case <-time.After(10 * time.Second):
			return errors.New("the steps above its mark did not run beside it")
		}
		log("destroy")
		return errors.New("destroy failed")
	})
	go func() {
		for {
			mu.Lock()
			n := len(ran)
			mu.Unlock()
			if n == 2 {
				close(release)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	err := c.Clean()
	if want := []string{"beside 2", "beside 1", "destroy", "below"}; !slices.Equal(ran, want) {
		t.Errorf("steps ran as %v; want %v", ran, want)
	}
	if err == nil || err.Error() != "destroy failed" {
		t.Errorf("Clean = %v; want the beside step's error", err)
	}
	if c.Len() != 0 {
		t.Errorf("Len %d after Clean", c.Len())
	}
}
