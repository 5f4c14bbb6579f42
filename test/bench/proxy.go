package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy"
)

// proxyBytes is what each transfer moves.
const proxyBytes = 256 << 20

// proxyBench measures a bulk download through a run's egress path (from
// the sandbox namespace, CONNECT through agentrun's proxy in the gateway
// namespace, to a server on the host's loopback) against the same download
// straight over loopback, in MiB/s, the median of 3 each.
func proxyBench() (viaProxy, direct float64, err error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer l.Close()
	go func() {
		buf := make([]byte, 1<<20)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for n := 0; n < proxyBytes; n += len(buf) {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port

	subnets, err := netns.NewSubnets(netns.DefaultCIDR)
	if err != nil {
		return 0, 0, err
	}
	n, err := subnets.Setup()
	if err != nil {
		return 0, 0, err
	}
	defer n.Close()
	allow, err := netpolicy.ParseAllow([]string{"bulk.test:" + strconv.Itoa(port)})
	if err != nil {
		return 0, 0, err
	}
	p, err := proxy.Start(n, proxy.Policy{
		Allow:     allow,
		Hosts:     map[string]netip.Addr{"bulk.test": netip.MustParseAddr("127.0.0.1")},
		HostPorts: []netip.AddrPort{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))},
	})
	if err != nil {
		return 0, 0, err
	}
	defer p.Close()

	gw := net.JoinHostPort(n.Gateway.String(), strconv.Itoa(proxy.ProxyPort))
	var viaRuns, directRuns []time.Duration
	for range 3 {
		d, err := timedDownload(func() (net.Conn, error) {
			c, err := n.DialContext(context.Background(), netns.Sandbox, "tcp4", gw)
			if err != nil {
				return nil, err
			}
			target := "bulk.test:" + strconv.Itoa(port)
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				c.Close()
				return nil, err
			}
			if resp.StatusCode != http.StatusOK {
				c.Close()
				return nil, fmt.Errorf("proxy answered %s", resp.Status)
			}
			return &bufferedConn{Conn: c, r: br}, nil
		})
		if err != nil {
			return 0, 0, fmt.Errorf("through the proxy: %w", err)
		}
		viaRuns = append(viaRuns, d)
		if d, err = timedDownload(func() (net.Conn, error) { return net.Dial("tcp4", l.Addr().String()) }); err != nil {
			return 0, 0, fmt.Errorf("direct: %w", err)
		}
		directRuns = append(directRuns, d)
	}
	rate := func(d time.Duration) float64 { return float64(proxyBytes) / (1 << 20) / d.Seconds() }
	return rate(median(viaRuns)), rate(median(directRuns)), nil
}

// timedDownload reads everything the connection dial makes delivers.
func timedDownload(dial func() (net.Conn, error)) (time.Duration, error) {
	start := time.Now()
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	got, err := io.Copy(io.Discard, c)
	if err != nil {
		return 0, err
	}
	if got != proxyBytes {
		return 0, fmt.Errorf("got %d bytes, want %d", got, proxyBytes)
	}
	return time.Since(start), nil
}

// bufferedConn reads first what the response parser buffered.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
