package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ToolsHost is the name the sandbox reaches the run's tool broker by,
// over plain HTTP on ToolsPort: through the explicit proxy (absolute form,
// or CONNECT) or the transparent listener, whose DNS answer is the
// gateway. It is no name of the host's: nothing is dialled for it.
const (
	ToolsHost = "tools.agentrun"
	ToolsPort = 80
)

// maxToolsResponse bounds what one answer of the broker may hold when the
// proxy keeps it to write it whole (an absolute-form request): the
// broker bounds its results below this.
const maxToolsResponse = 64 << 20

var errToolsResponse = errors.New("tool broker's answer too large")

// isTools reports whether t is the tool broker and the run has one.
func (p *Proxy) isTools(t target) bool {
	return p.policy.Tools != nil && t.host == ToolsHost && t.port == ToolsPort
}

// serveToolsOne answers one plain-HTTP request already read from c with
// the tool broker, then closes, as serveOne does for a service.
func (p *Proxy) serveToolsOne(c net.Conn, req *http.Request) {
	c.SetDeadline(time.Time{})
	ctx, stop := untilHangup(p.ctx, c)
	defer stop()
	w := &bufferedResponse{header: http.Header{}}
	p.policy.Tools.ServeHTTP(w, req.WithContext(ctx))
	resp := &http.Response{
		StatusCode: w.statusCode(), ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()),
		Close: true, Request: req,
	}
	resp.Write(c)
}

// serveToolsConn serves the connection c (bytes already read in br) with
// the tool broker as an HTTP/1.1 server: after CONNECT tools.agentrun:80.
func (p *Proxy) serveToolsConn(c net.Conn, br *bufio.Reader) {
	c.SetDeadline(time.Time{})
	p.serveConn(c, &prefixConn{Conn: c, r: br}, p.policy.Tools)
}

// bufferedResponse is an http.ResponseWriter that keeps the answer, up to
// maxToolsResponse bytes, for serveToolsOne to write whole.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
	over   bool
}

func (w *bufferedResponse) Header() http.Header { return w.header }

func (w *bufferedResponse) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *bufferedResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.body.Len()+len(b) > maxToolsResponse {
		w.over = true
		return 0, errToolsResponse
	}
	return w.body.Write(b)
}

// statusCode is the answer's status: 502 when the answer was past the
// bound (its body then says so instead).
func (w *bufferedResponse) statusCode() int {
	if w.over {
		w.body.Reset()
		w.body.WriteString(`{"error":"agentrun: the tool broker's answer is larger than ` + strconv.Itoa(maxToolsResponse) + ` bytes"}`)
		w.header.Set("Content-Type", "application/json")
		return http.StatusBadGateway
	}
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}
