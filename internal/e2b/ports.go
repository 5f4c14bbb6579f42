package e2b

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// portIdle closes a connection to a sandbox's port when no byte has
// gone either way for so long.
const portIdle = 5 * time.Minute

// proxyPort streams r to port inside sb (from inside its network
// namespace: runapi.Sandbox's DialPort, within its bound of connections)
// and the answer back, an upgrade too; E2B's own headers and tokens
// never reach the sandbox.
func proxyPort(w http.ResponseWriter, r *http.Request, sb runapi.Sandbox, port int) {
	host := net.JoinHostPort("localhost", strconv.Itoa(port))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			out := pr.Out
			out.URL.Scheme, out.URL.Host, out.Host = "http", host, host
			for _, h := range []string{SandboxIDHeader, SandboxPortHeader, AccessTokenHeader, TrafficTokenHeader, APIKeyHeader} {
				out.Header.Del(h)
			}
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := sb.DialPort(ctx, port)
				if err != nil {
					return nil, err
				}
				_ = c.SetDeadline(time.Now().Add(portIdle))
				return &idleConn{Conn: c}, nil
			},
			DisableKeepAlives:      true, // none held idle against the sandbox's bound
			DisableCompression:     true,
			MaxResponseHeaderBytes: 64 << 10,
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			switch {
			case errors.Is(err, context.Canceled):
			case errkind.Of(err) == errkind.Busy:
				writeRetry(w, time.Second, fmt.Sprintf("port %d of the sandbox: %v", port, err))
			default:
				// E2B's proxy answers 502 for a port nothing listens on.
				WriteError(w, http.StatusBadGateway, fmt.Sprintf("port %d of the sandbox: %v", port, err))
			}
		},
	}
	rp.ServeHTTP(w, r)
}

// idleConn moves its deadline on with each byte either way.
type idleConn struct{ net.Conn }

func (c *idleConn) Read(b []byte) (int, error) {
	_ = c.Conn.SetDeadline(time.Now().Add(portIdle))
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetDeadline(time.Now().Add(portIdle))
	return c.Conn.Write(b)
}
