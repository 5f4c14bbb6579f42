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

// Pool hands out /30 subnets from one IPv4 range. Two runs of the same
// process never hold the same subnet at once.
type Pool struct {
	mu   sync.Mutex
	base uint32       // first address of the range
	n    int          // number of /30 subnets in the range
	used map[int]bool // subnet index -> held
	next int          // where the next search starts (round robin: a freed subnet is not handed out again at once)
}

// NewPool returns a pool over cidr (an IPv4 prefix of /30 or wider).
func NewPool(cidr string) (*Pool, error) {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("parsing subnet pool %q: %w", cidr, err)
	}
	if !pfx.Addr().Is4() {
		return nil, fmt.Errorf("subnet pool %q: not an IPv4 prefix", cidr)
	}
	if pfx.Bits() > 30 {
		return nil, fmt.Errorf("subnet pool %q: narrower than /30", cidr)
	}
	pfx = pfx.Masked()
	a := pfx.Addr().As4()
	return &Pool{
		base: binary.BigEndian.Uint32(a[:]),
		n:    1 << (30 - pfx.Bits()),
		used: make(map[int]bool),
	}, nil
}

// Size is how many /30 subnets the pool holds.
func (p *Pool) Size() int { return p.n }

// InUse is how many subnets are handed out now.
func (p *Pool) InUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.used)
}

// acquire reserves a free subnet and returns its index.
func (p *Pool) acquire() (int, error) {
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
	return 0, fmt.Errorf("subnet pool exhausted: all %d /30 subnets in use", p.n)
}

// release returns subnet idx to the pool.
func (p *Pool) release(idx int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.used, idx)
}

// addrs returns the gateway (.1) and sandbox (.2) addresses of subnet idx.
func (p *Pool) addrs(idx int) (gw, sbx net.IP) {
	first := p.base + uint32(idx)*4
	gw = make(net.IP, 4)
	sbx = make(net.IP, 4)
	binary.BigEndian.PutUint32(gw, first+1)
	binary.BigEndian.PutUint32(sbx, first+2)
	return gw, sbx
}
