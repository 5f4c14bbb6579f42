package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

// clientHello returns the first bytes a Go TLS client sends for sni.
func clientHello(t testing.TB, sni string) []byte {
	t.Helper()
	c, s := net.Pipe()
	go func() {
		tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: sni == ""})
		tc.SetDeadline(time.Now().Add(2 * time.Second))
		tc.Handshake()
		c.Close()
	}()
	s.SetDeadline(time.Now().Add(2 * time.Second))
	var buf bytes.Buffer
	b := make([]byte, 4096)
	for {
		n, err := s.Read(b)
		buf.Write(b[:n])
		if _, err2 := clientHelloSNI(buf.Bytes()); !errors.Is(err2, errIncomplete) || err != nil {
			break
		}
	}
	s.Close()
	return buf.Bytes()
}

func TestClientHelloSNI(t *testing.T) {
	hello := clientHello(t, "files.pythonhosted.org")
	sni, err := clientHelloSNI(hello)
	if err != nil || sni != "files.pythonhosted.org" {
		t.Fatalf("clientHelloSNI = %q, %v; want files.pythonhosted.org", sni, err)
	}
	// Every prefix is incomplete, never an error or a name.
	for i := 0; i < len(hello); i++ {
		if sni, err := clientHelloSNI(hello[:i]); !errors.Is(err, errIncomplete) {
			t.Fatalf("clientHelloSNI(hello[:%d]) = %q, %v; want errIncomplete", i, sni, err)
		}
	}
	// The same hello split over two records.
	body := hello[5:]
	var split []byte
	for _, part := range [][]byte{body[:10], body[10:]} {
		split = append(split, 22, 3, 1, byte(len(part)>>8), byte(len(part)))
		split = append(split, part...)
	}
	if sni, err := clientHelloSNI(split); err != nil || sni != "files.pythonhosted.org" {
		t.Errorf("clientHelloSNI(two records) = %q, %v", sni, err)
	}
	// No SNI at all.
	if sni, err := clientHelloSNI(clientHello(t, "")); err != nil || sni != "" {
		t.Errorf("clientHelloSNI(no sni) = %q, %v; want \"\", nil", sni, err)
	}
	for _, bad := range [][]byte{{23, 3, 3, 0, 1, 0}, {22, 3, 3, 0, 0}, {22, 3, 3, 0, 4, 2, 0, 0, 0}, []byte("GET / HTTP/1.1\r\n")} {
		if _, err := clientHelloSNI(bad); err == nil || errors.Is(err, errIncomplete) {
			t.Errorf("clientHelloSNI(%q) = %v; want a parse error", bad, err)
		}
	}
}

func parseProxy(raw string) (target, error) {
	req, err := readRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		return target{}, err
	}
	return proxyTarget(req)
}

func TestProxyTarget(t *testing.T) {
	tests := []struct {
		raw    string
		host   string
		port   int
		reason string
	}{
		{"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", "pypi.org", 443, ""},
		{"CONNECT PyPI.org.:443 HTTP/1.1\r\n\r\n", "pypi.org", 443, ""},
		{"GET http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", 80, ""},
		{"GET http://pypi.org:8080/x HTTP/1.1\r\nHost: evil.com\r\n\r\n", "pypi.org", 8080, ""},
		{"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"CONNECT 3232235777:443 HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"CONNECT 0xc0a80101:443 HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"CONNECT [::ffff:127.0.0.1]:443 HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"CONNECT ::1:443 HTTP/1.1\r\n\r\n", "", 0, "*"}, // malformed: 400
		{"GET http://3232235777/ HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"GET http://[::ffff:a9fe:a9fe]/ HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\n\r\n", "", 0, reasonIPLiteral},
		{"CONNECT user:pw@pypi.org:443 HTTP/1.1\r\n\r\n", "", 0, reasonUserinfo},
		{"GET http://user@pypi.org/ HTTP/1.1\r\n\r\n", "", 0, reasonUserinfo},
		{"CONNECT pypi.org HTTP/1.1\r\n\r\n", "", 0, reasonBadPort},
		{"CONNECT pypi.org:0x1bb HTTP/1.1\r\n\r\n", "", 0, reasonBadPort},
		{"GET https://pypi.org/ HTTP/1.1\r\n\r\n", "", 0, reasonScheme},
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "", 0, "absolute form"},
		{"CONNECT pyp\u0131.org:443 HTTP/1.1\r\n\r\n", "", 0, reasonBadHost},
	}
	for _, tt := range tests {
		got, err := parseProxy(tt.raw)
		if tt.reason == "" {
			if err != nil || got.host != tt.host || got.port != tt.port {
				t.Errorf("proxyTarget(%q) = %+v, %v; want %s:%d", tt.raw, got, err, tt.host, tt.port)
			}
			continue
		}
		if err == nil || tt.reason != "*" && !strings.Contains(err.Error(), tt.reason) {
			t.Errorf("proxyTarget(%q) = %+v, %v; want %q", tt.raw, got, err, tt.reason)
		}
	}
}

func TestHostTarget(t *testing.T) {
	tests := []struct {
		raw, host, reason string
	}{
		{"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", ""},
		{"GET / HTTP/1.1\r\nHost: pypi.org:8080\r\n\r\n", "pypi.org", ""},
		{"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", "", reasonIPLiteral},
		{"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", "", reasonIPLiteral},
		{"GET / HTTP/1.0\r\n\r\n", "", reasonNoHost},
		{"GET / HTTP/1.1\r\nHost: u@pypi.org\r\n\r\n", "", reasonUserinfo},
	}
	for _, tt := range tests {
		req, err := readRequest(bufio.NewReader(strings.NewReader(tt.raw)))
		if err != nil {
			if tt.reason == "" {
				t.Errorf("readRequest(%q): %v", tt.raw, err)
			}
			continue
		}
		got, err := hostTarget(req, 80)
		if tt.reason == "" {
			if err != nil || got.host != tt.host || got.port != 80 {
				t.Errorf("hostTarget(%q) = %+v, %v; want %s:80", tt.raw, got, err, tt.host)
			}
		} else if err == nil || !strings.Contains(err.Error(), tt.reason) {
			t.Errorf("hostTarget(%q) = %+v, %v; want %q", tt.raw, got, err, tt.reason)
		}
	}
}

// FuzzParseRequest feeds arbitrary bytes to every parser that sees
// sandbox input first: the proxy request, the Host header and the TLS
// ClientHello. Whatever they accept must be a canonical, non-IP name and a
// valid port.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n",
		"GET http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: files.pythonhosted.org\r\n\r\n",
		"CONNECT [::ffff:127.0.0.1]:443 HTTP/1.1\r\n\r\n",
		"GET http://user@3232235777:80/ HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Add(clientHello(f, "pypi.org"))
	f.Add(clientHello(f, ""))
	f.Fuzz(func(t *testing.T, data []byte) {
		check := func(what string, tg target, err error) {
			if err != nil {
				var d *denial
				if !errors.As(err, &d) || d.reason == "" {
					t.Fatalf("%s: error %v is not a denial", what, err)
				}
				return
			}
			if c, ok := netpolicy.CanonicalName(tg.host); !ok || c != tg.host {
				t.Fatalf("%s: accepted non-canonical host %q", what, tg.host)
			}
			if tg.port < 1 || tg.port > 65535 {
				t.Fatalf("%s: accepted port %d", what, tg.port)
			}
		}
		if req, err := readRequest(bufio.NewReader(bytes.NewReader(data))); err == nil {
			tg, err := proxyTarget(req)
			check("proxyTarget", tg, err)
			tg, err = hostTarget(req, 80)
			check("hostTarget", tg, err)
		}
		if sni, err := clientHelloSNI(data); err == nil && sni != "" {
			tg, err := checkHost(sni, 443)
			check("sni", tg, err)
		}
		a, err := netpolicy.ParseAllow([]string{"pypi.org", "*.pythonhosted.org"})
		if err != nil {
			t.Fatal(err)
		}
		if h := string(data); a.Match(h, 443) {
			c, _ := netpolicy.CanonicalName(h)
			if c != "pypi.org" && !strings.HasSuffix(c, ".pythonhosted.org") {
				t.Fatalf("Match(%q) allowed a name outside the list", h)
			}
		}
	})
}

func TestReadRequestBoundsHead(t *testing.T) {
	many := "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n" + strings.Repeat("X: y\r\n", maxHeadLines) + "\r\n"
	if _, err := readRequest(bufio.NewReaderSize(strings.NewReader(many), 32<<10)); err == nil || !strings.Contains(err.Error(), "lines") {
		t.Errorf("head of %d lines: %v; want refused", maxHeadLines+2, err)
	}
	big := "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: " + strings.Repeat("y", 40<<10) + "\r\n\r\n"
	if _, err := readRequest(bufio.NewReaderSize(strings.NewReader(big), 32<<10)); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("40 KiB head: %v; want refused", err)
	}
	lf := "GET http://a.test/ HTTP/1.1\nHost: a.test\n\nbody"
	if req, err := readRequest(bufio.NewReaderSize(strings.NewReader(lf), 32<<10)); err != nil || req.Host != "a.test" {
		t.Errorf("LF-only head: %v, %v", req, err)
	}
}
