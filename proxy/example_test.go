package proxy_test

import (
	"fmt"
	"net/netip"

	"github.com/agentrun/agentrun/netns"
	"github.com/agentrun/agentrun/proxy"
)

// A run's network: namespaces first, then the proxy inside them; the
// container gets n.SandboxPath, p.Env() and the two generated files.
// Close in reverse order.
func Example() {
	pool, err := netns.NewPool(netns.DefaultCIDR)
	if err != nil {
		panic(err)
	}
	n, err := pool.Setup() // needs root
	if err != nil {
		panic(err)
	}
	defer n.Close()
	p, err := proxy.Start(n, proxy.Policy{
		Allow:      []string{"pypi.org", "*.pythonhosted.org"},
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

func ExampleAllowlist_Match() {
	a, err := proxy.ParseAllow([]string{"pypi.org", "*.pythonhosted.org", "api.example.com:8443"})
	if err != nil {
		panic(err)
	}
	fmt.Println(a.Match("PyPI.org.", 443), a.Match("pypi.org.evil.com", 443))
	fmt.Println(a.Match("files.pythonhosted.org", 80), a.Match("pythonhosted.org", 80))
	fmt.Println(a.Match("api.example.com", 8443), a.Match("api.example.com", 443))
	// Output:
	// true false
	// true false
	// true false
}

func ExampleCheckAddr() {
	bench := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	fmt.Println(proxy.CheckAddr(netip.MustParseAddr("8.8.8.8"), nil, nil))
	fmt.Println(proxy.CheckAddr(netip.MustParseAddr("::ffff:169.254.169.254"), nil, nil))
	fmt.Println(proxy.CheckAddr(netip.MustParseAddr("198.18.0.2"), bench, nil))
	// Output:
	// <nil>
	// address 169.254.169.254 is not globally routable
	// <nil>
}
