package image

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/vishvananda/netlink"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/internal/endpoint"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/hostaddr"
	"github.com/agentrun/agentrun/test/oracle"
	"github.com/agentrun/agentrun/test/testenv"
)

// acceptCounter listens on 127.0.0.1 and counts the connections made to
// it, closing each at once.
func acceptCounter(t *testing.T) (addr string, accepts *atomic.Int64) {
	return acceptCounterAt(t, "127.0.0.1")
}

// acceptCounterAt is acceptCounter on ip.
func acceptCounterAt(t *testing.T, ip string) (addr string, accepts *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepts = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), accepts
}

// mustParseRegistry is endpoint.ParseRegistry of an entry known to be good.
func mustParseRegistry(t *testing.T, s string) endpoint.Registry {
	t.Helper()
	r, err := endpoint.ParseRegistry(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func registries(t *testing.T, hosts ...string) *Registries {
	t.Helper()
	var entries []endpoint.Registry
	for _, h := range hosts {
		e, err := endpoint.ParseRegistry(h)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, e)
	}
	return NewRegistries(entries, hostaddr.Own)
}

// A task's reference to a host service (a loopback port here) that the
// policy does not list is refused before anything is dialled, whatever
// answers there; it says nothing about that port.
func TestUnlistedRegistryRefusedBeforeConnect(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	addr, accepts := acceptCounter(t)
	listedOther := imagetest.Registry(t)
	for _, ref := range []string{addr + "/any/thing:tag", "10.1.2.3:5000/x:y", "169.254.169.254/latest/meta-data:x", "python:3.12-slim"} {
		for _, pull := range []func(context.Context, string, PullOptions) (*Image, error){e.store.Get, e.store.Pull} {
			_, err := pull(ctx, ref, PullOptions{Registries: registries(t, listedOther)})
			var pe *PolicyError
			if !errors.Is(err, errkind.ErrPolicy) || !errors.As(err, &pe) || pe.AtConnect {
				t.Fatalf("%s: err = %v; want a PolicyError before connecting", ref, err)
			}
			var ie *Error
			if !errors.As(err, &ie) || !strings.Contains(ie.Summary(), "policy.registries") {
				t.Errorf("%s: summary of %v does not name policy.registries", ref, err)
			}
		}
	}
	if n := accepts.Load(); n != 0 {
		t.Errorf("%d connections reached the unlisted host service", n)
	}
	e.checkNothingPublished(t)
}

// A listed loopback registry works; what the store holds is served to a
// task even when its registry is not listed (no connection is made).
func TestListedRegistryPulls(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	host := imagetest.Registry(t)
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	img, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{Registries: registries(t, host)})
	if err != nil {
		t.Fatalf("Get from a listed registry: %v", err)
	}
	checkRootfs(t, img)
	if _, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{Registries: registries(t)}); err != nil {
		t.Errorf("Get of a stored image under an empty policy: %v", err)
	}
	if _, err := e.store.Pull(ctx, host+"/test/app:v1", PullOptions{Registries: registries(t)}); !errors.Is(err, errkind.ErrPolicy) {
		t.Errorf("Pull (which asks the registry) under an empty policy: err = %v; want errkind.ErrPolicy", err)
	}
}

// A listed registry that redirects to a loopback address that is not
// listed, by IP or by a name that resolves there (localhost), is refused
// when the redirect is dialled: the target sees no connection.
func TestRedirectToUnlistedAddressRefusedAtDial(t *testing.T) {
	ctx := context.Background()
	target, accepts := acceptCounter(t)
	_, port, _ := net.SplitHostPort(target)
	for _, to := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		t.Run(to, func(t *testing.T) {
			e := newEnv(t)
			host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
						http.Redirect(w, r, "http://"+to+"/internal/admin", http.StatusTemporaryRedirect)
						return
					}
					h.ServeHTTP(w, r)
				})
			})
			imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
			_, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{Registries: registries(t, host)})
			var pe *PolicyError
			if !errors.As(err, &pe) || !pe.AtConnect {
				t.Fatalf("err = %v; want a PolicyError at connect time", err)
			}
			var ie *Error
			if !errors.As(err, &ie) || strings.Contains(ie.Summary(), port) || strings.Contains(ie.Summary(), "internal/admin") {
				t.Errorf("summary %q tells where the redirect led", ie.Summary())
			}
			if !strings.Contains(err.Error(), to) {
				t.Errorf("detail %q does not say where the redirect led", err)
			}
			if n := accepts.Load(); n != 0 {
				t.Errorf("%d connections reached the redirect's target", n)
			}
			e.checkNothingPublished(t)
		})
	}
	// Without a policy (the operator's own pull) the same redirect is
	// followed: the check is the policy's.
	e := newEnv(t)
	host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet {
				http.Redirect(w, r, "http://"+target+"/x", http.StatusTemporaryRedirect)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	e.store.Attempts = 1
	if _, err := e.store.Get(ctx, host+"/test/app:v1", PullOptions{}); err == nil {
		t.Fatal("a pull whose blobs are an empty answer succeeded")
	}
	if accepts.Load() == 0 {
		t.Error("the unrestricted pull never dialled the redirect: the test proves nothing")
	}
}

// A redirect to the host's own address is refused at dial even when the
// address is a public one, which the ranges alone let through: an
// address of a veth of the test's own, 1.2.3.4, while the test runs.
func TestRedirectToHostsOwnPublicAddressRefused(t *testing.T) {
	testenv.RequireRoot(t)
	name := fmt.Sprintf("%sim%d", testenv.FixtureLinkPrefix, os.Getpid()%100000)
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(link) })
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	own := "1.2.3.4"
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(own).To4(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	// Listening there succeeds only once the address is the host's.
	var target string
	var accepts *atomic.Int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ln, err := net.Listen("tcp", own+":0"); err == nil {
			ln.Close()
			target, accepts = acceptCounterAt(t, own)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the veth's address never became the host's")
		}
	}
	e := newEnv(t)
	host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				http.Redirect(w, r, "http://"+target+"/internal/admin", http.StatusTemporaryRedirect)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	imagetest.PushDir(t, host, "test/app", "v1", sampleRootfs(t))
	_, err := e.store.Get(context.Background(), host+"/test/app:v1", PullOptions{Registries: registries(t, host)})
	var pe *PolicyError
	if !errors.As(err, &pe) || !pe.AtConnect {
		t.Fatalf("err = %v; want a PolicyError at connect time", err)
	}
	if n := accepts.Load(); n != 0 {
		t.Errorf("%d connections reached the host's own address", n)
	}
	e.checkNothingPublished(t)
}

// What a registry sends with an error (a 404 page, say) and how a
// connection failed stay out of the summary a task sees; the detail has
// them.
func TestRegistryErrorBodyStaysOutOfSummary(t *testing.T) {
	ctx := context.Background()
	const secret = "INTERNAL-ADMIN-PAGE-s3cr3t"
	e := newEnv(t)
	host := imagetest.RegistryWith(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/manifests/") {
				for _, code := range []int{404, 401, 418} {
					if strings.HasSuffix(r.URL.Path, "/t"+strconv.Itoa(code)) {
						http.Error(w, secret, code)
						return
					}
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	closed, _ := acceptCounter(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close()
	e.store.Attempts = 2
	for _, tc := range []struct {
		ref  string
		kind error
	}{
		{host + "/x/y:t404", ErrNotFound},
		{host + "/x/y:t401", ErrUnauthorized},
		{host + "/x/y:t418", nil},
		{closed + "/x/y:z", ErrUnreachable},
		{refused + "/x/y:z", ErrUnreachable},
	} {
		reg := strings.SplitN(tc.ref, "/", 2)[0]
		_, err := e.store.Get(ctx, tc.ref, PullOptions{Registries: registries(t, reg)})
		var ie *Error
		if err == nil || !errors.As(err, &ie) {
			t.Fatalf("%s: err = %v; want an *Error", tc.ref, err)
		}
		if tc.kind != nil && !errors.Is(err, tc.kind) {
			t.Errorf("%s: err = %v; want %v", tc.ref, err, tc.kind)
		}
		s := ie.Summary()
		for _, leak := range []string{secret, "refused", "reset", "EOF", "127.0.0.1:" + strings.Split(reg, ":")[1] + "/v2"} {
			if strings.Contains(s, leak) {
				t.Errorf("%s: summary %q holds %q", tc.ref, s, leak)
			}
		}
		if !strings.Contains(s, tc.ref) {
			t.Errorf("summary %q does not name the reference", s)
		}
		if tc.kind == ErrNotFound && !strings.Contains(err.Error(), secret) {
			t.Errorf("detail %q lacks what the registry said", err)
		}
		t.Logf("%s: summary %q", tc.ref, s)
	}
}

// A name that does not resolve is a registry that cannot be reached: it
// is retried like one, and the error says how many tries were made.
func TestUnresolvableRegistryRetried(t *testing.T) {
	e := newEnv(t)
	for _, opts := range []PullOptions{{}, {Registries: registries(t, "registry.invalid")}} {
		_, err := e.store.Get(context.Background(), "registry.invalid/x/y:z", opts)
		if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "after 4 attempts") {
			t.Errorf("err = %v; want ErrUnreachable after 4 attempts", err)
		}
	}
	e.store.Attempts = 1
	if _, err := e.store.Get(context.Background(), "registry.invalid/x/y:z", PullOptions{}); err == nil || !strings.Contains(err.Error(), "after 1 attempt:") {
		t.Errorf("err = %v; want one attempt, in the singular", err)
	}
}

// A bare path is not a reference: the error says what references look
// like.
func TestPathIsNotAReference(t *testing.T) {
	e := newEnv(t)
	for _, ref := range []string{"/srv/rootfs", "./rootfs", "../x", "~/img"} {
		_, err := e.store.Get(context.Background(), ref, PullOptions{})
		if !errors.Is(err, ErrBadReference) {
			t.Fatalf("%s: err = %v; want ErrBadReference", ref, err)
		}
		for _, w := range []string{"dir:", "oci:", "docker-archive:", "host:port/name:tag"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v does not mention %s", ref, err, w)
			}
		}
	}
	if _, err := parseReference("/srv/rootfs"); !errors.Is(err, ErrBadReference) {
		t.Errorf("parseReference(/srv/rootfs): %v", err)
	}
}

func TestParseRegistryRefusesBadEntries(t *testing.T) {
	for _, bad := range []string{"", "http://x", "a/b", "x@y", "a..b", "a:0", "a:x", "[::1]"} {
		if _, err := endpoint.ParseRegistry(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if r := mustParseRegistry(t, "docker.io"); r.String() != "docker.io" || r.Key() != "index.docker.io" {
		t.Errorf("docker.io read as %q (%q); want it shown as written, listed as index.docker.io", r.String(), r.Key())
	}
	r := registries(t, "docker.io", "127.0.0.1:5000", "reg.example", "[::1]:5000")
	for _, ok := range [][2]string{{"index.docker.io", "443"}, {"127.0.0.1", "5000"}, {"reg.example", "80"}, {"::1", "5000"}} {
		if !r.listsAddr(ok[0], ok[1]) {
			t.Errorf("%v not listed", ok)
		}
	}
	for _, no := range [][2]string{{"127.0.0.1", "5001"}, {"reg.example", "5000"}, {"localhost", "5000"}} {
		if r.listsAddr(no[0], no[1]) {
			t.Errorf("%v listed", no)
		}
	}
}

// The config reads policy.registries without go-containerregistry
// (internal/endpoint), and reads an entry as go-containerregistry does:
// an entry it accepts is one that the strict name.NewRegistry accepts,
// naming the registry that pulls compare; one it refuses past its own
// host and port rules, name.NewRegistry refuses, in its words.
func TestRegistryEntryAsContainerregistryReadsIt(t *testing.T) {
	cases := []string{"docker.io", "index.docker.io", "127.0.0.1:5000", "[::1]:5000", "::1", "[::1]", "fe80::1%eth0",
		"[fe80::1%25eth0]:5000", "a:65535", "a:65536", "1.2.3.4", "a.b-c.d:1", "A.B", "::ffff:1.2.3.4", "1::"}
	cases = append(cases, oracle.Random(3, 20000, 10, "a1.-:[]%")...)
	for _, s := range cases {
		r, err := endpoint.ParseRegistry(s)
		reg, nerr := name.NewRegistry(s, name.StrictValidation)
		switch {
		case err == nil && (nerr != nil || reg.RegistryStr() != r.Key()):
			t.Errorf("%q: read as %q; name.NewRegistry: %q, %v", s, r.Key(), reg.RegistryStr(), nerr)
		case err != nil && nerr != nil && strings.Contains(err.Error(), "RFC 3986") && err.Error() != fmt.Sprintf("%q: %v", s, nerr):
			t.Errorf("%q: %v; name.NewRegistry: %v", s, err, nerr)
		}
	}
}
