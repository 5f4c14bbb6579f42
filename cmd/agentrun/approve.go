package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/agentrun/agentrun/proxy"
)

// terminalApprover asks on the controlling terminal (/dev/tty) whether to
// let a request held for approval through, one question at a time; only
// "y" or "yes" approves. It is nil when there is no terminal: held
// requests are then denied.
func terminalApprover() func(context.Context, string, proxy.Approval) proxy.Decision {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	lines := make(chan string)
	var once sync.Once
	var mu sync.Mutex
	return func(ctx context.Context, run string, a proxy.Approval) proxy.Decision {
		mu.Lock()
		defer mu.Unlock()
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
		// a's fields are escaped already (proxy.Approval): shown as they are.
		fmt.Fprintf(tty, "\nagentrun: run %s: %sApprove? [y/N] ", run, a.Describe())
		select {
		case l, ok := <-lines:
			yes := ok && (strings.EqualFold(strings.TrimSpace(l), "y") || strings.EqualFold(strings.TrimSpace(l), "yes"))
			return proxy.Decision{Approved: yes, By: "terminal"}
		case <-ctx.Done():
			fmt.Fprintln(tty, "\nagentrun: no answer in time: denied")
			return proxy.Decision{By: "terminal"}
		}
	}
}
