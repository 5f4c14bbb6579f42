package netpolicy_test

import (
	"fmt"
	"net/netip"

	"github.com/agentrun/agentrun/internal/netpolicy"
)

func ExampleAllowlist_Match() {
	a, err := netpolicy.ParseAllow([]string{"pypi.org", "*.pythonhosted.org", "api.example.com:8443"})
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
	fmt.Println(netpolicy.CheckAddr(netip.MustParseAddr("8.8.8.8"), nil, nil))
	fmt.Println(netpolicy.CheckAddr(netip.MustParseAddr("::ffff:169.254.169.254"), nil, nil))
	fmt.Println(netpolicy.CheckAddr(netip.MustParseAddr("198.18.0.2"), bench, nil))
	// Output:
	// <nil>
	// address 169.254.169.254 is not globally routable
	// <nil>
}

func ExampleCanonicalAllow() {
	for _, e := range []string{"API.Example.com:08443", "*.pythonhosted.org", "https://pypi.org/simple"} {
		c, err := netpolicy.CanonicalAllow(e)
		fmt.Printf("%q %v\n", c, err)
	}
	// Output:
	// "api.example.com:8443" <nil>
	// "*.pythonhosted.org" <nil>
	// "" a URL, not a host name: give the host name alone ("pypi.org"), with an optional ":port"
}
