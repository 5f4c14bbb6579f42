package integration

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/test/testenv"
)

// TestLocalhostWithoutNetwork: a run without network still resolves
// localhost (its /etc/hosts names it, read-only) on both runtimes, and a
// server on 127.0.0.1 is reached by that name.
func TestLocalhostWithoutNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	code := `import socket
print(sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, socket.AF_INET)}))
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(1)
c = socket.create_connection(("localhost", s.getsockname()[1]), timeout=30)
a, _ = s.accept()
c.sendall(b"hi")
print(a.recv(2).decode())
try:
    open("/etc/hosts", "a")
    print("writable")
except OSError:
    print("read-only")
`
	task, _ := json.Marshal(map[string]any{"code": code})
	for _, rt := range runtimes {
		res := runIn(t, rt, string(task))
		if want := "['127.0.0.1']\nhi\nread-only\n"; res.Stdout != want {
			t.Errorf("%s: stdout %q, stderr %q, error %q; want %q", rt, res.Stdout, res.Stderr, res.Error, want)
		}
		if strings.Contains(res.Stderr, "gaierror") {
			t.Errorf("%s: localhost did not resolve", rt)
		}
	}
}
