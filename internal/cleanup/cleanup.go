// Package cleanup is the undo stack of a multi-step set-up: each step that
// makes something pushes the step that removes it, and on failure (or at
// the end of the thing's life) the stack is run, last step first.
//
// It has the shape of gVisor's pkg/cleanup (Add, Clean), with steps that
// can fail: Clean runs every step and joins their errors. A step may run
// beside the steps below it that it does not depend on (AddBeside).
package cleanup

import "errors"

// Cleanup is a stack of undo steps. Its zero value is an empty stack.
type Cleanup struct {
	steps []step
}

// step is an undo step; beside, for one AddBeside pushed, is the mark
// down to which the steps below it run beside it, -1 for every other.
type step struct {
	f      func() error
	beside int
}

// Add pushes f, which Clean runs before every step added earlier.
func (c *Cleanup) Add(f func() error) {
	c.steps = append(c.steps, step{f: f, beside: -1})
}

// AddBeside pushes f, which Clean runs beside the steps added since the
// stack held n (a Len), in a goroutine of its own: it starts f where Add's
// f would run, runs those steps meanwhile, and waits for f before any step
// added before them runs, and before it returns. Neither f nor those steps
// may depend on the other's having run, nor touch what the other does.
func (c *Cleanup) AddBeside(n int, f func() error) {
	c.steps = append(c.steps, step{f: f, beside: n})
}

// Clean runs every step, last added first, even when some fail, and empties
// the stack; the error joins those of the steps that failed.
func (c *Cleanup) Clean() error { return c.CleanTo(0) }

// Len is how many steps the stack holds: a mark for CleanTo and AddBeside.
func (c *Cleanup) Len() int { return len(c.steps) }

// CleanTo is Clean of the steps added since the stack held n (a Len), which
// leaves the n below; with n past the stack it runs none.
func (c *Cleanup) CleanTo(n int) error {
	var errs []error
	type running struct {
		mark int
		done chan error
	}
	var beside []running
	// waitBefore waits for the steps running beside that must end before
	// step i runs (i < 0: all of them).
	waitBefore := func(i int) {
		kept := beside[:0]
		for _, r := range beside {
			if r.mark <= i {
				kept = append(kept, r)
			} else if err := <-r.done; err != nil {
				errs = append(errs, err)
			}
		}
		beside = kept
	}
	for i := len(c.steps) - 1; i >= n; i-- {
		waitBefore(i)
		s := c.steps[i]
		if s.beside >= 0 && s.beside < i {
			done := make(chan error, 1)
			go func() { done <- s.f() }()
			beside = append(beside, running{mark: s.beside, done: done})
			continue
		}
		if err := s.f(); err != nil {
			errs = append(errs, err)
		}
	}
	waitBefore(-1)
	c.steps = c.steps[:min(n, len(c.steps))]
	return errors.Join(errs...)
}
