package endpoint

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// CheckWebhook accepts an http or https URL with a host and no fragment,
// the form of a webhook, as net/http reads a request's URL (an empty port
// dropped). Its errors show the URL as Redact does.
func CheckWebhook(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("not a URL")
	}
	host := u.Host
	if strings.LastIndex(host, ":") > strings.LastIndex(host, "]") {
		host = strings.TrimSuffix(host, ":")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s: want an http:// or https:// URL", Redact(s))
	case host == "" || u.Fragment != "" || strings.ContainsAny(s, " \t\r\n"):
		return fmt.Errorf("%s: want a URL with a host and no fragment", Redact(s))
	}
	return nil
}

// Redact is the webhook URL s as logs and errors show it: its scheme and
// host (with the port) and "/…", never its path, query or user info, any
// of which may carry a secret of the receiver's; "…" alone when s has no
// host to show.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" || strings.ContainsAny(u.Host, "@/?# \t\r\n") {
		return "…"
	}
	return u.Scheme + "://" + u.Host + "/…"
}
