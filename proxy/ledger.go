package proxy

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// ledger is what a proxy records of its run, for Report: the connections
// to each allowed destination and the bytes they carried, the distinct
// denials and failures, and the service requests and approval decisions,
// each bounded. Its zero value is empty and ready; its own lock guards it,
// and it takes no other.
type ledger struct {
	mu              sync.Mutex
	allowed         map[target]*hostStats
	allowedOrder    []target
	denied          tally
	failed          tally // as netpolicy.Failed records
	approvals       []netpolicy.ApprovalRecord
	requests        []netpolicy.ServiceRequest
	requestsDropped int
}

type hostStats struct {
	in, out atomic.Int64
	conns   atomic.Int64
}

type deniedKey struct {
	host, reason string
	port         int
}

// report returns a snapshot of the ledger.
func (l *ledger) report() netpolicy.Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := netpolicy.Report{Allowed: []netpolicy.Allowed{}, Denied: slices.Clone(l.denied.list), Failed: make([]netpolicy.Failed, 0, len(l.failed.list))}
	if r.Denied == nil {
		r.Denied = []netpolicy.Denied{}
	}
	r.Requests, r.Approvals, r.RequestsDropped = slices.Clone(l.requests), slices.Clone(l.approvals), l.requestsDropped
	for _, f := range l.failed.list {
		r.Failed = append(r.Failed, netpolicy.Failed(f))
	}
	for _, hp := range l.allowedOrder {
		st := l.allowed[hp]
		r.Allowed = append(r.Allowed, netpolicy.Allowed{
			Host: hp.host, Port: hp.port,
			BytesIn: st.in.Load(), BytesOut: st.out.Load(),
			Conns: int(st.conns.Load()),
		})
	}
	return r
}

// deny adds one refusal.
func (l *ledger) deny(host string, port int, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.denied.add(printable(host), port, reason, "further distinct denials not recorded")
}

// fail adds one failure to reach an allowed destination.
func (l *ledger) fail(host string, port int, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed.add(printable(host), port, reason, "further distinct failures not recorded")
}

// request adds one service request, or counts it as dropped past
// maxDenied.
func (l *ledger) request(r netpolicy.ServiceRequest) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.requests) < maxDenied {
		l.requests = append(l.requests, r)
	} else {
		l.requestsDropped++
	}
}

// approval adds one decision on a held request: the first maxDenied,
// and past them those that must be kept.
func (l *ledger) approval(a netpolicy.ApprovalRecord, keep bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.approvals) < maxDenied || keep {
		l.approvals = append(l.approvals, a)
	}
}

// stats returns the counters of host:port, creating them.
func (l *ledger) stats(t target) *hostStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.allowed[t]
	if st == nil {
		if l.allowed == nil {
			l.allowed = make(map[target]*hostStats)
		}
		st = &hostStats{}
		l.allowed[t] = st
		l.allowedOrder = append(l.allowedOrder, t)
	}
	return st
}

// tally keeps distinct records with their counts, at most maxDenied of
// them and then one saying that more were dropped.
type tally struct {
	index   map[deniedKey]int // into list
	list    []netpolicy.Denied
	dropped bool
}

func (t *tally) add(host string, port int, reason, overflow string) {
	k := deniedKey{host, reason, port}
	if i, ok := t.index[k]; ok {
		t.list[i].Count++
		return
	}
	if len(t.list) >= maxDenied {
		if !t.dropped {
			t.dropped = true
			t.list = append(t.list, netpolicy.Denied{Host: "*", Reason: overflow, Count: 1})
		}
		return
	}
	if t.index == nil {
		t.index = make(map[deniedKey]int)
	}
	t.index[k] = len(t.list)
	t.list = append(t.list, netpolicy.Denied{Host: host, Port: port, Reason: reason, Count: 1})
}
