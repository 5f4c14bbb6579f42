package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/agentrun/agentrun/internal/approvals"
)

// terminalApprover asks on the controlling terminal (/dev/tty) whether to
// let a request held for approval through, one question at a time; only
// "y" or "yes" approves. It is nil when there is no terminal: held
// requests are then denied.
func terminalApprover() approvals.RunFunc {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	return askOn(tty)
}

// askOn asks on tty, one question at a time. A request whose time runs
// out while it waits for its turn is denied without a question, and an
// answer read once its time ran out is said to be too late: only an
// answer in time counts, and it counts as given (Decision.Taken).
func askOn(tty io.ReadWriter) approvals.RunFunc {
	lines := make(chan string)
	var once sync.Once
	turn := make(chan struct{}, 1)
	return func(ctx context.Context, run string, a approvals.Approval) approvals.Decision {
		select {
		case turn <- struct{}{}:
			defer func() { <-turn }()
		case <-ctx.Done():
			return approvals.Decision{By: "terminal"}
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
		// a's fields are escaped already (approvals.Approval): shown as they are.
		fmt.Fprintf(tty, "\nagentrun: run %s: %sApprove? [y/N] ", run, a.Describe())
		select {
		case l, ok := <-lines:
			if ctx.Err() != nil {
				break
			}
			yes := ok && (strings.EqualFold(strings.TrimSpace(l), "y") || strings.EqualFold(strings.TrimSpace(l), "yes"))
			return approvals.Decision{Approved: yes, By: "terminal", Taken: true}
		case <-ctx.Done():
		}
		fmt.Fprintln(tty, "\nagentrun: no answer in time: denied")
		return approvals.Decision{By: "terminal"}
	}
}
