package netns

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
)

// DefaultCIDR is the range the runner's subnets come from unless configured.
const DefaultCIDR = "10.200.0.0/16"

// Subnets hands out /30 subnets from one IPv4 range. Two runs of the same
// process never hold the same subnet at once.
type Subnets struct {
	mu   sync.Mutex
	base uint32       // first address of the range
	n    int          // number of /30 subnets in the range
	used map[int]bool // subnet index -> held
	next int          // where the next search starts (round robin: a freed subnet is not handed out again at once)
}

// NewSubnets returns the subnets of cidr (an IPv4 prefix of /30 or wider).
func NewSubnets(cidr string) (*Subnets, error) {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("parsing subnet range %q: %w", cidr, err)
	}
	if !pfx.Addr().Is4() {
		return nil, fmt.Errorf("subnet range %q: not an IPv4 prefix", cidr)
	}
	if pfx.Bits() > 30 {
		return nil, fmt.Errorf("subnet range %q: narrower than /30", cidr)
	}
	pfx = pfx.Masked()
	a := pfx.Addr().As4()
	return &Subnets{
		base: binary.BigEndian.Uint32(a[:]),
		n:    1 << (30 - pfx.Bits()),
		used: make(map[int]bool),
	}, nil
}

// Size is how many /30 subnets the range holds.
func (p *Subnets) Size() int { return p.n }

// InUse is how many subnets are handed out now.
func (p *Subnets) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.used)
}

// acquire reserves a free subnet and returns its index.
func (p *Subnets) acquire() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < p.n; i++ {
		idx := (p.next + i) % p.n
		if !p.used[idx] {
			p.used[idx] = true
			p.next = (idx + 1) % p.n
			return idx, nil
		}
	}
	return 0, fmt.Errorf("subnet range exhausted: all %d /30 subnets in use", p.n)
}

// release makes subnet idx free again.
func (p *Subnets) release(idx int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.used, idx)
}

// addrs returns the gateway (.1) and sandbox (.2) addresses of subnet idx.
func (p *Subnets) addrs(idx int) (gw, sbx net.IP) {
	first := p.base + uint32(idx)*4
	gw = make(net.IP, 4)
	sbx = make(net.IP, 4)
	binary.BigEndian.PutUint32(gw, first+1)
	binary.BigEndian.PutUint32(sbx, first+2)
	return gw, sbx
}
