package proxy_test

import (
	"fmt"
	"net/netip"

	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy"
)

// A run's network: namespaces first, then the proxy inside them; the
// container gets n.SandboxPath, p.Env() and the two generated files.
// Close in reverse order.
func Example() {
	subnets, err := netns.NewSubnets(netns.DefaultCIDR)
	if err != nil {
		panic(err)
	}
	n, err := subnets.Setup() // needs root
	if err != nil {
		panic(err)
	}
	defer n.Close()
	allow, err := netpolicy.ParseAllow([]string{"pypi.org", "*.pythonhosted.org"})
	if err != nil {
		panic(err)
	}
	p, err := proxy.Start(n, proxy.Policy{
		Allow:      allow,
		DenyRanges: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
		MaxBytes:   512 << 20,
		MaxConns:   64,
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	fmt.Println(n.SandboxPath, p.Env()["HTTPS_PROXY"])
	fmt.Printf("%s", p.ResolvConf())
	// ... run the container ...
	fmt.Printf("%+v\n", p.Report())
}
