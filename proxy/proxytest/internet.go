// Package proxytest provides a fake internet host for tests of egress:
// a network namespace at a 198.18.0.0/15 address, joined to the host by a
// veth, serving HTTP and HTTPS with a self-signed certificate.
//
// It is for tests only; production code never imports it.
package proxytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/agentrun/agentrun/test/testenv"
)

// InNS runs fn on a locked thread inside ns (None: where it is); the thread is discarded if
// it cannot be moved back.
func InNS(ns vnetns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if ns.IsOpen() {
			if err := vnetns.Set(ns); err != nil {
				errc <- err
				return
			}
		}
		err = fn()
		if rerr := vnetns.Set(orig); rerr != nil {
			errc <- errors.Join(err, rerr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Internet is a fake internet host: its own namespace at a 198.18.0.0/15
// address (in a /29 it shares with the host end and Silent), joined to the host namespace by a veth, serving HTTP on 80,
// HTTPS on 443 (certificate for internet.test and *.internet.test) and a
// UDP echo on 9999.
type Internet struct {
	IP     netip.Addr // where it serves
	HostIP netip.Addr // host end of its veth
	Silent netip.Addr // an address on its link that nothing holds: a dial gets no answer
	// Mux serves both ports; a test may add its own paths.
	Mux   *http.ServeMux
	Roots *x509.CertPool // trusts its certificate
	CAPEM []byte         // its self-signed certificate, PEM, for a sandbox to trust

	mu       sync.Mutex
	received []string
}

// Received lists the request line ("METHOD REQUEST-URI", exactly as
// received, before any routing or cleaning) of every HTTP request the host
// got on either port, oldest first.
func (in *Internet) Received() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]string(nil), in.received...)
}

// NewInternet starts a fake internet host; t.Cleanup removes it, its
// namespace and its veth (named with testenv.FixtureLinkPrefix, which
// leak checks pass over).
func NewInternet(t testing.TB) *Internet {
	t.Helper()
	idx := mrand.IntN(1 << 14) // a random /29 in 198.18.0.0/15
	base := netip.AddrFrom4([4]byte{198, 18 + byte(idx>>13), byte(idx >> 5), byte(idx<<3) & 0xf8})
	in := &Internet{HostIP: base.Next(), IP: base.Next().Next()}
	in.Silent = in.IP.Next()

	var ns vnetns.NsHandle
	if err := InNS(vnetns.None(), func() error {
		var err error
		ns, err = vnetns.New()
		return err
	}); err != nil {
		t.Fatalf("creating internet namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })

	name := fmt.Sprintf("%s%08x", testenv.FixtureLinkPrefix, mrand.Uint32())
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "inet0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("creating veth %s: %v", name, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			netlink.LinkDel(l)
		}
	})
	hostLink, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	mask := net.CIDRMask(29, 32)
	if err := netlink.AddrAdd(hostLink, &netlink.Addr{IPNet: &net.IPNet{IP: in.HostIP.AsSlice(), Mask: mask}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(hostLink); err != nil {
		t.Fatal(err)
	}
	err = InNS(ns, func() error {
		for _, l := range []string{"lo", "inet0"} {
			link, err := netlink.LinkByName(l)
			if err != nil {
				return err
			}
			if l == "inet0" {
				if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: in.IP.AsSlice(), Mask: mask}}); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("configuring internet namespace: %v", err)
	}

	cert, roots := selfSigned(t)
	in.Roots = roots
	in.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	mux := http.NewServeMux()
	in.Mux = mux
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		fmt.Fprintf(w, "hello from %s over %s", r.Host, scheme)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 256<<10))
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(w, r.Body)
	})
	for _, port := range []int{80, 443} {
		var l net.Listener
		if err := InNS(ns, func() error {
			var err error
			l, err = net.Listen("tcp4", netip.AddrPortFrom(in.IP, uint16(port)).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			in.mu.Lock()
			in.received = append(in.received, r.Method+" "+r.RequestURI)
			in.mu.Unlock()
			mux.ServeHTTP(w, r)
		}), ErrorLog: nil}
		if port == 443 {
			l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}})
		}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	var pc net.PacketConn
	if err := InNS(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(in.IP, 9999).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		b := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			pc.WriteTo(b[:n], from)
		}
	}()
	t.Cleanup(func() { pc.Close() })

	// Positive control: the host reaches it.
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + in.IP.String() + "/hello")
	if err != nil {
		t.Fatalf("control: host cannot reach the fake internet host: %v", err)
	}
	resp.Body.Close()
	c.CloseIdleConnections()
	return in
}

func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "internet.test"},
		DNSNames:              []string{"internet.test", "*.internet.test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}
