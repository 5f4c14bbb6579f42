package netpolicy

// Report lists a run's egress decisions, as agentrun's proxy and DNS
// server recorded them, and the allowed destinations it could not reach.
// It is the network section of the run's result and audit record.
type Report struct {
	Allowed []Allowed `json:"allowed"`
	Denied  []Denied  `json:"denied"`
	Failed  []Failed  `json:"failed"`
	// Requests to services and their decisions, and every decision on a
	// request held for approval; absent in runs without services.
	Requests  []ServiceRequest `json:"requests,omitempty"`
	Approvals []ApprovalRecord `json:"approvals,omitempty"`
	// RequestsDropped counts service requests past the record's bound.
	RequestsDropped int `json:"requests_dropped,omitempty"`
	// None is set for a run that had no network at all (no allowlist,
	// services or tools): its sandbox held the loopback alone, so its
	// name lookups and connections failed inside it, where no proxy or
	// DNS server of agentrun's saw them, and none is listed above. Note
	// says so in words, for the person or model reading the result.
	None bool   `json:"none,omitempty"`
	Note string `json:"note,omitempty"`
}

// Allowed sums the connections to one allowed host and port, with the
// bytes they carried.
type Allowed struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	BytesIn  int64  `json:"bytes_in"`  // upstream to sandbox
	BytesOut int64  `json:"bytes_out"` // sandbox to upstream
	Conns    int    `json:"conns"`     // connections made
}

// Denied is one distinct refusal and why (DNS refusals have Port 53).
type Denied struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason"`
	Count  int    `json:"count"` // times it happened
}

// Failed is one distinct failure to reach an allowed destination and why:
// its name did not resolve, or no address of it took the connection.
type Failed struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason"` // such as "name does not resolve", "connection refused"
	Count  int    `json:"count"`  // times it happened
}

// ServiceRequest is one request to a service: what was asked, how it was
// decided, which headers the proxy injected (names only, never values) and
// the upstream's status (0 when it was not sent or got no answer).
type ServiceRequest struct {
	Service  string   `json:"service"`
	Method   string   `json:"method"`
	Path     string   `json:"path"`
	Allowed  bool     `json:"allowed"`
	Reason   string   `json:"reason,omitempty"`
	Approval string   `json:"approval,omitempty"` // id of its ApprovalRecord
	Injected []string `json:"injected,omitempty"`
	Status   int      `json:"status,omitempty"`
}

// ApprovalRecord is one decision on a request held for approval, and who
// or what made it ("timeout", "no way to ask", the operator's channel).
type ApprovalRecord struct {
	ID       string `json:"id"`
	Service  string `json:"service"`
	Method   string `json:"method"`
	URL      string `json:"url"`
	Approved bool   `json:"approved"`
	By       string `json:"by"`
	// Taken: By was told its decision was taken (Decision.Taken),
	// a person's decision, which the bounds of the records keep first.
	Taken bool `json:"taken,omitempty"`
}
