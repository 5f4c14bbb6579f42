package endpoint_test

import (
	"fmt"

	"github.com/agentrun/agentrun/internal/endpoint"
)

func ExampleParseRegistry() {
	r, err := endpoint.ParseRegistry("docker.io")
	fmt.Println(r, r.Key(), err)
	_, err = endpoint.ParseRegistry("http://127.0.0.1:5000")
	fmt.Println(err)
	// Output:
	// docker.io index.docker.io <nil>
	// "http://127.0.0.1:5000": want a registry host name, host:port or ip:port
}

func ExampleRedact() {
	fmt.Println(endpoint.Redact("https://alice:pw@hooks.internal:8443/s3cret?key=k"))
	fmt.Println(endpoint.CheckWebhook("ftp://hooks.internal/s3cret"))
	// Output:
	// https://hooks.internal:8443/…
	// ftp://hooks.internal/…: want an http:// or https:// URL
}
