package proxy

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// A ledger's zero value reports three empty lists and no service fields,
// and every record stays within its bound however many goroutines add.
func TestLedger(t *testing.T) {
	var l ledger
	if b, _ := json.Marshal(l.report()); string(b) != `{"allowed":[],"denied":[],"failed":[]}` {
		t.Errorf("empty report = %s", b)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range maxDenied {
				l.deny(fmt.Sprintf("h%d.example", i), 443, "not in allowlist")
				l.fail("\x1bx.example", 443, "connection refused")
				l.request(netpolicy.ServiceRequest{Service: "api", Method: "GET", Path: fmt.Sprintf("/%d/%d", g, i)})
				l.approval(netpolicy.ApprovalRecord{ID: fmt.Sprintf("ap-%d-%d", g, i)}, false)
				l.stats(target{"pypi.org", 443}).conns.Add(1)
			}
		}()
	}
	wg.Wait()
	r := l.report()
	if len(r.Denied) != maxDenied || r.Denied[0].Count != 4 {
		t.Errorf("denied: %d records, the first counted %d; want %d, 4", len(r.Denied), r.Denied[0].Count, maxDenied)
	}
	if len(r.Failed) != 1 || r.Failed[0].Host != "?x.example" || r.Failed[0].Count != 4*maxDenied {
		t.Errorf("failed = %+v; want one printable record counted %d times", r.Failed, 4*maxDenied)
	}
	if len(r.Requests) != maxDenied || r.RequestsDropped != 3*maxDenied || len(r.Approvals) != maxDenied {
		t.Errorf("requests %d (dropped %d), approvals %d; want %d (%d), %d", len(r.Requests), r.RequestsDropped, len(r.Approvals), maxDenied, 3*maxDenied, maxDenied)
	}
	if len(r.Allowed) != 1 || r.Allowed[0].Conns != 4*maxDenied {
		t.Errorf("allowed = %+v; want pypi.org:443 with %d connections", r.Allowed, 4*maxDenied)
	}
	l.approval(netpolicy.ApprovalRecord{ID: "ap-approved", Approved: true}, true)
	if r := l.report(); len(r.Approvals) != maxDenied+1 || r.Approvals[maxDenied].ID != "ap-approved" {
		t.Errorf("past the bound: %d approvals; want the one kept recorded too", len(r.Approvals))
	}
	l.deny("one-more.example", 443, "not in allowlist")
	if r := l.report(); len(r.Denied) != maxDenied+1 || r.Denied[maxDenied].Host != "*" {
		t.Errorf("past the bound: %d records, the last %+v; want one overflow record", len(r.Denied), r.Denied[len(r.Denied)-1])
	}
}
