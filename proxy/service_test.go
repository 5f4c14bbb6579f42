package proxy

import (
	"crypto/x509"
	"net/http"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/jsonkeys"
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

// TestHeldJSONBody: which held bodies are read as JSON, and which of
// those are refused before anyone is asked.
func TestHeldJSONBody(t *testing.T) {
	typed := func(ct string) http.Header { return http.Header{"Content-Type": {ct}} }
	for _, c := range []struct {
		h      http.Header
		body   string
		isJSON bool
		refuse string // in the refusal; "" for none
	}{
		{typed("text/plain"), "hello", false, ""},
		{typed("text/plain"), `{"to":"a","to":"b"}`, true, "JSON body: key /to appears twice in its object"},
		{http.Header{}, "  \r\n[{\"to\":1},{\"x\":1,\"x\":2}]", true, "key /1/x appears twice"},
		{http.Header{}, "\ufeff{\"to\":1,\"To\":2}", true, "key /To appears twice in its object, in other letter case"},
		{typed("application/json; charset=utf-8"), `{"to":"a","cc":["b"]}`, true, ""},
		{typed("application/vnd.github+json"), "{\"to\":\"a\"}\n{\"to\":\"a\",\"to\":\"b\"}", true, "key /to appears twice"},
		{typed("application/json"), `{"to":"a",}`, true, "body declared JSON is not JSON"},
		{typed("application/json"), "", true, ""},
		{typed("text/plain"), `{not json, "to":1,"to":2}`, true, ""}, // not JSON, shown as it is
		{typed("text/plain"), `{"title":"hi"} and more`, true, ""},
		{typed("text/plain"), strings.Repeat("[", jsonkeys.MaxDepth+1), true, "JSON body nested deeper than"},
		{typed("text/plain"), strings.Repeat(" ", bodyExcerpt+1), true, ""},
		{typed("application/json"), `{"a":"` + strings.Repeat("x", MaxJSONBytes) + `"}`, true, "JSON body longer than 65536 bytes"},
	} {
		if got := jsonBody(c.h, []byte(c.body[:min(len(c.body), bodyExcerpt+1)])); got != c.isJSON {
			t.Errorf("jsonBody(%v, %.40q) = %v; want %v", c.h, c.body, got, c.isJSON)
		}
		got := jsonRefusal(c.h, []byte(c.body[:min(len(c.body), MaxJSONBytes+1)]))
		if (c.refuse == "") != (got == "") || !strings.Contains(got, c.refuse) {
			t.Errorf("jsonRefusal(%v, %.40q) = %q; want %q", c.h, c.body, got, c.refuse)
		}
	}
}
