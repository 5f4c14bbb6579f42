package config

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// MaxReplicas is the most replicas a JetStream stream can have.
const MaxReplicas = 5

func (w Worker) validate() error {
	if len(w.NATS) == 0 {
		return fieldErr("worker.nats", errors.New("at least one server URL is required"))
	}
	for i, s := range w.NATS {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
			return fieldErr(fmt.Sprintf("worker.nats[%d]", i), fmt.Errorf("%q is not a nats:// or tls:// URL with a host", s))
		}
	}
	for _, f := range []struct{ name, path string }{
		{"creds", w.Creds}, {"tls.ca", w.TLS.CA}, {"tls.cert", w.TLS.Cert}, {"tls.key", w.TLS.Key},
	} {
		if f.path != "" && !isCleanAbs(f.path) {
			return fieldErr("worker."+f.name, fmt.Errorf("%q is not a clean absolute path", f.path))
		}
	}
	if (w.TLS.Cert == "") != (w.TLS.Key == "") {
		return fieldErr("worker.tls", errors.New("cert and key go together"))
	}
	for _, f := range []struct {
		name, v string
		ok      func(string) bool
		what    string
		empty   bool
	}{
		{"stream", w.Stream, isNATSName, "1-64 characters of A-Z a-z 0-9 _ -", false},
		{"results", w.Results, isNATSName, "1-64 characters of A-Z a-z 0-9 _ -", false},
		{"subject", w.Subject, isNATSSubject, "tokens of A-Z a-z 0-9 _ - joined by dots (no wildcards)", false},
		{"events", w.Events, isNATSSubject, "tokens of A-Z a-z 0-9 _ - joined by dots, or \"\" for none", true},
		{"approvals.subject", w.Approvals.Subject, isNATSSubject, "tokens of A-Z a-z 0-9 _ - joined by dots (no wildcards)", false},
	} {
		if (f.v != "" || !f.empty) && !f.ok(f.v) {
			return fieldErr("worker."+f.name, fmt.Errorf("%q: must be %s", f.v, f.what))
		}
	}
	if w.Slots < 0 {
		return fieldErr("worker.slots", fmt.Errorf("%d: must not be negative (0: server.max_concurrent)", w.Slots))
	}
	if w.MaxDeliver < 1 {
		return fieldErr("worker.max_deliver", fmt.Errorf("%d: must be at least 1", w.MaxDeliver))
	}
	if w.Replicas < 1 || w.Replicas > MaxReplicas {
		return fieldErr("worker.replicas", fmt.Errorf("%d: must be 1 to %d", w.Replicas, MaxReplicas))
	}
	for _, f := range []struct {
		name string
		v    Duration
		min  time.Duration
	}{{"ack_wait", w.AckWait, time.Second}, {"retry_delay", w.RetryDelay, 0}, {"result_ttl", w.ResultTTL, time.Second}} {
		if !f.v.IsSet() {
			return fieldErr("worker."+f.name, errors.New("required"))
		}
		if f.v.Duration() < f.min {
			return fieldErr("worker."+f.name, fmt.Errorf("%s: must be at least %s", f.v, f.min))
		}
	}
	return checkWebhook("worker.approvals", w.Approvals.Webhook, w.Approvals.WebhookSecretFile)
}
