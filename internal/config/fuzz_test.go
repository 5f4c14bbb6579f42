package config

import "testing"

// FuzzLoadConfig checks that Parse never panics and that what it accepts validates.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"limits":{"memory":"512m","cpus":1},"policy":{"allow_network":false},"languages":{"node":null,"rb":["ruby","{file}"]}}`))
	f.Add([]byte(`{"server":{"listen":"tcp://127.0.0.1:1","quota":{"concurrent":1},"pool":{"alpine":1}},"network":{"hosts":{"a.b":"::1"},"deny_ranges":["10.0.0.0/8"]}}`))
	f.Add([]byte(`{"polcy":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v", err)
		}
	})
}
