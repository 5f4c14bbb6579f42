package proxy

import (
	"crypto/x509"
	"strings"
	"testing"
)

func TestCALeaves(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	l, err := ca.leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if l2, _ := ca.leaf("api.example.com"); l2 != l {
		t.Errorf("leaf not cached")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	if _, err := l.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots}); err != nil {
		t.Errorf("leaf does not verify under its CA: %v", err)
	}
	other, _ := NewCA()
	if strings.EqualFold(string(other.CertPEM()), string(ca.CertPEM())) {
		t.Errorf("two CAs have the same certificate")
	}
	for i := range maxLeaves + 1 {
		_, err = ca.leaf(strings.Repeat("a", i+1) + ".example")
	}
	if err == nil {
		t.Errorf("minted more than %d leaves", maxLeaves)
	}
}
