package netns

import (
	"net"
	"strings"
	"testing"
)

func TestNewSubnetsRejects(t *testing.T) {
	for _, cidr := range []string{"", "10.200.0.0", "fd00::/64", "10.0.0.0/31", "10.0.0.1/32", "nonsense/16"} {
		if _, err := NewSubnets(cidr); err == nil {
			t.Errorf("NewSubnets(%q) = nil error; want an error", cidr)
		}
	}
}

func TestPoolAddrs(t *testing.T) {
	p, err := NewSubnets("10.200.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Size(), 16384; got != want {
		t.Fatalf("Size() = %d; want %d", got, want)
	}
	gw, sbx := p.addrs(0)
	if !gw.Equal(net.ParseIP("10.200.0.1")) || !sbx.Equal(net.ParseIP("10.200.0.2")) {
		t.Errorf("addrs(0) = %v, %v; want 10.200.0.1, 10.200.0.2", gw, sbx)
	}
	gw, sbx = p.addrs(16383)
	if !gw.Equal(net.ParseIP("10.200.255.253")) || !sbx.Equal(net.ParseIP("10.200.255.254")) {
		t.Errorf("addrs(last) = %v, %v; want 10.200.255.253, 10.200.255.254", gw, sbx)
	}
	// A host address in the CIDR is masked to its network.
	p, err = NewSubnets("10.9.8.7/29")
	if err != nil {
		t.Fatal(err)
	}
	if gw, _ := p.addrs(1); !gw.Equal(net.ParseIP("10.9.8.5")) {
		t.Errorf("addrs(1) of 10.9.8.7/29 = %v; want 10.9.8.5", gw)
	}
}

func TestPoolExhaustionAndReuse(t *testing.T) {
	p, err := NewSubnets("10.1.0.0/29") // two /30s
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.acquire()
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.acquire()
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatalf("acquire twice gave subnet %d both times", a)
	}
	if _, err := p.acquire(); err == nil || !strings.Contains(err.Error(), "exhausted") {
		t.Fatalf("third acquire error = %v; want exhausted", err)
	}
	p.release(a)
	c, err := p.acquire()
	if err != nil || c != a {
		t.Fatalf("acquire after release = %d, %v; want %d, nil", c, err, a)
	}
	if got := p.InUse(); got != 2 {
		t.Errorf("InUse() = %d; want 2", got)
	}
}
