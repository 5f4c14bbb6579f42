package result

import (
	"encoding/json"
	"testing"
)

// TestNetworkJSON pins the encoding of a run's result, its network
// section above all: the section is netpolicy's Report, and its field
// names, order and omissions are the result's contract.
func TestNetworkJSON(t *testing.T) {
	r := Result{
		ID: "r-1", Session: "s-1", ExitCode: 0, Stdout: "ok\n", StdoutBytes: 3, DurationMS: 812, CPUMS: 40,
		MemoryPeakBytes: 1 << 20, Image: "python:3.12-slim", ImageDigest: "sha256:ab", Runtime: "libcontainer",
		Network: Network{
			Allowed: []Allowed{{Host: "pypi.org", Port: 443, BytesIn: 5120, BytesOut: 610, Conns: 2}},
			Denied:  []Denied{{Host: "evil.example", Port: 443, Reason: "not in allowlist", Count: 3}, {Host: "metadata.example", Port: 53, Reason: "not in allowlist", Count: 1}},
			Failed:  []Failed{{Host: "files.pythonhosted.org", Port: 443, Reason: "connection refused", Count: 1}},
			Requests: []ServiceRequest{
				{Service: "gh", Method: "GET", Path: "/repos/a/b", Allowed: true, Injected: []string{"Authorization"}, Status: 200},
				{Service: "gh", Method: "POST", Path: "/repos/a/b/issues", Allowed: false, Reason: "denied by the operator", Approval: "ap-1"},
				{Service: "gh", Method: "DELETE", Path: "/repos/a/b", Reason: "no rule of service gh allows DELETE /repos/a/b"},
			},
			Approvals:       []Approval{{ID: "ap-1", Service: "gh", Method: "POST", URL: "https://api.github.com/repos/a/b/issues", By: "operator"}},
			RequestsDropped: 4,
		},
		Files: map[string]File{"out.txt": {Size: 2, ContentBase64: "aGk="}},
	}
	want := `{"id":"r-1","session":"s-1","exit_code":0,"signal":"","timed_out":false,"oom_killed":false,"stdout":"ok\n","stderr":"",` +
		`"stdout_truncated":false,"stderr_truncated":false,"stdout_bytes":3,"stderr_bytes":0,"duration_ms":812,"cpu_ms":40,` +
		`"memory_peak_bytes":1048576,"image":"python:3.12-slim","image_digest":"sha256:ab","runtime":"libcontainer",` +
		`"network":{"allowed":[{"host":"pypi.org","port":443,"bytes_in":5120,"bytes_out":610,"conns":2}],` +
		`"denied":[{"host":"evil.example","port":443,"reason":"not in allowlist","count":3},{"host":"metadata.example","port":53,"reason":"not in allowlist","count":1}],` +
		`"failed":[{"host":"files.pythonhosted.org","port":443,"reason":"connection refused","count":1}],` +
		`"requests":[{"service":"gh","method":"GET","path":"/repos/a/b","allowed":true,"injected":["Authorization"],"status":200},` +
		`{"service":"gh","method":"POST","path":"/repos/a/b/issues","allowed":false,"reason":"denied by the operator","approval":"ap-1"},` +
		`{"service":"gh","method":"DELETE","path":"/repos/a/b","allowed":false,"reason":"no rule of service gh allows DELETE /repos/a/b"}],` +
		`"approvals":[{"id":"ap-1","service":"gh","method":"POST","url":"https://api.github.com/repos/a/b/issues","approved":false,"by":"operator"}],` +
		`"requests_dropped":4},` +
		`"files":{"out.txt":{"size":2,"content_base64":"aGk="}},"error":""}`
	got, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("json.Marshal(result) =\n%s\nwant\n%s", got, want)
	}

	// A run with a network that saw nothing: the three lists as the
	// runner sets them, the service fields and none absent.
	bare := Network{Allowed: []Allowed{}, Denied: []Denied{}, Failed: []Failed{}}
	if got, _ := json.Marshal(bare); string(got) != `{"allowed":[],"denied":[],"failed":[]}` {
		t.Errorf("json.Marshal(empty network) = %s", got)
	}
	// A run without network says so.
	want = `{"allowed":[],"denied":[],"failed":[],"none":true,"note":"` + NoNetworkNote + `"}`
	if got, _ := json.Marshal(NoNetwork()); string(got) != want {
		t.Errorf("json.Marshal(NoNetwork()) = %s; want %s", got, want)
	}
}
