package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/server"
)

// TestServeStalledBodiesDelayNoRun: 16 clients that each declare a body
// of 24 MiB, send 1 MiB of it and stop, with max_concurrent 2, do not
// delay a 17th client's run: it is answered while all 16 are still
// connected, unanswered and being read by serve (their 30 s to send the
// body not yet run out), holding no run slot and only the memory of what
// they sent.
func TestServeStalledBodiesDelayNoRun(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "b.sock")
	s := startServe(t, map[string]any{"listen": "unix://" + sock, "max_concurrent": 2, "queue": 32})
	const stalled, declared, sent = 16, 24 << 20, 1 << 20
	conns := make([]net.Conn, 0, stalled)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	answered := make(chan string, stalled)
	for i := range stalled {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		head := `{"code": "`
		fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: agentrun\r\nContent-Length: %d\r\n\r\n%s", declared, head)
		// Written aside: more than the socket holds, which a server that
		// does not read it leaves the writer waiting on.
		go io.WriteString(c, strings.Repeat("a", sent-len(head)))
		go func() {
			// Whatever serve sends such a client (its 408, or the
			// connection's end) is an answer before its body.
			b := make([]byte, 64)
			n, err := c.Read(b)
			if n > 0 || !strings.Contains(fmt.Sprint(err), "use of closed network connection") {
				answered <- fmt.Sprintf("client %d: %q %v", i, b[:n], err)
			}
		}()
	}
	// All 16 in serve's hands: their bodies being read (or, as serve did
	// before, 2 of them holding the run slots and 14 waiting in the queue).
	s.waitHealth("the 16 stalled clients taken in", func(h server.Health) bool {
		return h.Queued == stalled-2 || s.scrape()["agentrun_bodies_reading{}"] == stalled
	})

	ran := make(chan string, 1)
	go func() {
		resp, err := s.client.Post(s.base+"/v1/runs", "application/json", strings.NewReader(`{"code": "print(7)"}`))
		if err != nil {
			ran <- err.Error()
			return
		}
		defer resp.Body.Close()
		var res result.Result
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 || res.Stdout != "7\n" {
			ran <- fmt.Sprintf("status %d, %v: %+v", resp.StatusCode, err, res)
			return
		}
		ran <- ""
	}()
	select {
	case failed := <-ran:
		if failed != "" {
			t.Fatalf("the 17th client's run: %s", failed)
		}
	case a := <-answered:
		t.Fatalf("a stalled client was answered before the 17th client's run: %s", a)
	case <-time.After(5 * time.Minute): // a guard against a hang, no measure
		t.Fatal("neither the 17th client nor a stalled one was answered")
	}
	// Still none answered, all being read, and the budget holds about
	// what they sent (at most twice), not what they declared.
	select {
	case a := <-answered:
		t.Fatalf("a stalled client was answered with the 17th client's run: %s", a)
	default:
	}
	m := s.scrape()
	if n := m["agentrun_bodies_reading{}"]; n != stalled {
		t.Errorf("%v bodies being read after the 17th client's run; want the %d stalled ones", n, stalled)
	}
	if b := m["agentrun_body_bytes{}"]; b <= 0 || b > 2*stalled*sent {
		t.Errorf("the stalled bodies hold %v bytes of serve's body budget; want at most twice the %d they sent", b, stalled*sent)
	}

	for _, c := range conns {
		c.Close()
	}
	s.waitHealth("the stalled bodies let go", func(server.Health) bool {
		m := s.scrape()
		return m["agentrun_bodies_reading{}"] == 0 && m["agentrun_body_bytes{}"] == 0
	})
	s.waitIdle()
	s.stop()
	assertNoLeaks(t)
}
