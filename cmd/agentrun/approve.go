package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/names"
	"github.com/agentrun/agentrun/internal/untrusted"
	"github.com/agentrun/agentrun/internal/worker"
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
	return approvals.Terminal(tty)
}

// approveWait bounds the wait for the holding worker's reply.
const approveWait = 10 * time.Second

// cmdApprove decides a worker's held request over NATS: exit 0 when a
// worker took the decision, 1 when none holds the request, 125 on a
// usage or connection error.
func cmdApprove(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("approve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file whose worker section names NATS (default "+config.DefaultPath+")")
	natsURL := fs.String("nats", os.Getenv("AGENTRUN_NATS"), "NATS server URL(s), comma-separated, instead of the config's worker.nats (also $AGENTRUN_NATS)")
	by := fs.String("by", "", "who decides, recorded as \"operator (nats: NAME)\" (default: \"operator (nats)\")")
	if err := fs.Parse(args); err != nil {
		return 125
	}
	if fs.NArg() != 2 {
		fmt.Fprintln(stderr, "agentrun approve: want an approval id and yes or no")
		return 125
	}
	id, answer := fs.Arg(0), strings.ToLower(fs.Arg(1))
	if id == "" || len(id) > 64 || !names.Only(id, "-_") {
		fmt.Fprintf(stderr, "agentrun approve: %q is not an approval id (such as ap-0123456789abcdef)\n", id)
		return 125
	}
	if answer != "yes" && answer != "no" {
		fmt.Fprintf(stderr, "agentrun approve: %q: want yes or no\n", fs.Arg(1))
		return 125
	}
	cfg, err := config.Load(*cfgPath)
	if err == nil && *natsURL != "" {
		cfg.Worker.NATS = strings.Split(*natsURL, ",")
		if err = cfg.Validate(); err != nil {
			err = fmt.Errorf("--nats: %w", err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "agentrun approve: %v\n", err)
		return 125
	}
	nc, err := worker.Connect(cfg.Worker, "agentrun approve")
	if err != nil {
		fmt.Fprintf(stderr, "agentrun approve: %v\n", err)
		return 125
	}
	defer nc.Close()
	body, _ := json.Marshal(worker.Decision{Approve: answer == "yes", By: *by})
	msg, err := nc.Request(worker.DecisionSubject(cfg.Worker.Approvals.Subject, id), body, approveWait)
	if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) {
		fmt.Fprintf(stderr, "agentrun approve: no worker holds approval %s: it was decided, timed out, or its request ended\n", id)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "agentrun approve: %v\n", err)
		return 125
	}
	var r worker.DecisionReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		fmt.Fprintf(stderr, "agentrun approve: the worker's answer is not understood: %v\n", err)
		return 125
	}
	return printReply(stdout, stderr, id, r)
}

// printReply says what the worker answered about approval id: its words
// come off the bus (any party on it may answer), so they are escaped
// (untrusted.Text) and draw nothing on the terminal but themselves.
func printReply(stdout, stderr io.Writer, id string, r worker.DecisionReply) int {
	if r.Error != "" {
		fmt.Fprintf(stderr, "agentrun approve: approval %s: %s\n", id, untrusted.Text(r.Error))
		return 1
	}
	what := "denied"
	if r.Approved {
		what = "approved"
	}
	fmt.Fprintf(stdout, "approval %s of run %s: %s by %s\n", id, untrusted.Text(r.Run), what, untrusted.Text(r.By))
	return 0
}
