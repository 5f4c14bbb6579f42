// Package cleanup is the undo stack of a multi-step set-up: each step that
// makes something pushes the step that removes it, and on failure (or at
// the end of the thing's life) the stack is run, last step first.
//
// It has the shape of gVisor's pkg/cleanup (Add, Clean), with steps that
// can fail: Clean runs every step and joins their errors.
package cleanup

import "errors"

// Cleanup is a stack of undo steps. Its zero value is an empty stack.
type Cleanup struct {
	steps []func() error
}

// Add pushes f, which Clean runs before every step added earlier.
func (c *Cleanup) Add(f func() error) {
	c.steps = append(c.steps, f)
}

// Clean runs every step, last added first, even when some fail, and empties
// the stack; the error joins those of the steps that failed.
func (c *Cleanup) Clean() error { return c.CleanTo(0) }

// Len is how many steps the stack holds: a mark for CleanTo.
func (c *Cleanup) Len() int { return len(c.steps) }

// CleanTo is Clean of the steps added since the stack held n (a Len), which
// leaves the n below; with n past the stack it runs none.
func (c *Cleanup) CleanTo(n int) error {
	var errs []error
	for i := len(c.steps) - 1; i >= n; i-- {
		if err := c.steps[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.steps = c.steps[:min(n, len(c.steps))]
	return errors.Join(errs...)
}
