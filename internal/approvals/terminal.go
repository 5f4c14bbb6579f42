package approvals

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
)

// Terminal asks on tty (the controlling terminal of `agentrun run`)
// whether to let a held request or tool call through, one question at a
// time; only "y" or "yes" approves. A hold whose time runs out while it
// waits for its turn is denied without a question, and an answer read
// once its time ran out is said to be too late: only an answer in time
// counts, and it counts as given (Decision.Taken).
func Terminal(tty io.ReadWriter) RunFunc {
	lines := make(chan string)
	var once sync.Once
	turn := make(chan struct{}, 1)
	return func(ctx context.Context, run string, a Approval) Decision {
		select {
		case turn <- struct{}{}:
			defer func() { <-turn }()
		case <-ctx.Done():
			return Decision{By: "terminal"}
		}
		once.Do(func() {
			go func() {
				sc := bufio.NewScanner(tty)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
			}()
		})
		// A line typed before the question is no answer to it.
	drain:
		for {
			select {
			case _, ok := <-lines:
				if !ok {
					break drain
				}
			default:
				break drain
			}
		}
		// a's fields are escaped already (Approval): shown as they are.
		fmt.Fprintf(tty, "\nagentrun: run %s: %sApprove? [y/N] ", run, a.Describe())
		select {
		case l, ok := <-lines:
			if ctx.Err() != nil {
				break
			}
			yes := ok && (strings.EqualFold(strings.TrimSpace(l), "y") || strings.EqualFold(strings.TrimSpace(l), "yes"))
			return Decision{Approved: yes, By: "terminal", Taken: true}
		case <-ctx.Done():
		}
		fmt.Fprintln(tty, "\nagentrun: no answer in time: denied")
		return Decision{By: "terminal"}
	}
}
