package worker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentrun/agentrun/internal/config"
)

// Consumer is the name of the durable consumer all workers share.
const Consumer = "agentrun-workers"

// Duplicates is the stream's de-duplication window: a task published again
// with the same id within it is dropped by the stream itself; later, the
// worker finds its result and does not run it again.
const Duplicates = 10 * time.Minute

// IDHeader is the header holding the task id (NATS's de-duplication id).
const IDHeader = jetstream.MsgIDHeader

// Connect connects to the NATS servers of wc, with its credentials and
// TLS files. The connection reconnects for ever: a task running while the
// server is away goes on, and its result is stored once it is back.
func Connect(wc config.Worker, name string) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.Timeout(5 * time.Second),
		// Publishes made while reconnecting wait in a bounded buffer.
		nats.ReconnectBufSize(8 << 20),
	}
	if wc.Creds != "" {
		opts = append(opts, nats.UserCredentials(wc.Creds))
	}
	if wc.TLS.CA != "" {
		opts = append(opts, nats.RootCAs(wc.TLS.CA))
	}
	if wc.TLS.Cert != "" {
		opts = append(opts, nats.ClientCert(wc.TLS.Cert, wc.TLS.Key))
	}
	nc, err := nats.Connect(strings.Join(wc.NATS, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", strings.Join(wc.NATS, ","), err)
	}
	return nc, nil
}

// streamConfig is the work-queue stream a worker creates.
func streamConfig(wc config.Worker) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       wc.Stream,
		Subjects:   []string{wc.Subject},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   wc.Replicas,
		Duplicates: Duplicates,
		Discard:    jetstream.DiscardOld,
	}
}

// bucketConfig is the results bucket a worker creates.
func bucketConfig(wc config.Worker) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: wc.Results, History: 1, TTL: wc.ResultTTL.Duration(),
		Storage: jetstream.FileStorage, Replicas: wc.Replicas,
		Description: "agentrun results, keyed by task id"}
}

// EnsureStream returns the task stream, creating it when missing. A stream
// of that name that is not a work queue on the configured subject with the
// configured replicas is refused: workers never change what they did not
// make.
func EnsureStream(ctx context.Context, js jetstream.JetStream, wc config.Worker) (jetstream.Stream, error) {
	want := streamConfig(wc)
	s, err := js.Stream(ctx, wc.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("creating stream %s: %w", wc.Stream, err)
		}
		if err != nil { // another worker created it first
			s, err = js.Stream(ctx, wc.Stream)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", wc.Stream, err)
	}
	have := s.CachedInfo().Config
	var bad []string
	if have.Retention != jetstream.WorkQueuePolicy {
		bad = append(bad, fmt.Sprintf("retention is %s, not %s", have.Retention, jetstream.WorkQueuePolicy))
	}
	if !slices.Contains(have.Subjects, wc.Subject) {
		bad = append(bad, fmt.Sprintf("subjects %v do not include %s", have.Subjects, wc.Subject))
	}
	if have.Replicas != want.Replicas {
		bad = append(bad, fmt.Sprintf("%d replicas, not worker.replicas %d", have.Replicas, want.Replicas))
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("stream %s exists with incompatible settings: %s (remove it or fix the worker config)", wc.Stream, strings.Join(bad, "; "))
	}
	return s, nil
}

// EnsureBucket returns the results bucket, creating it when missing; one
// with other replicas or another TTL is refused.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, wc config.Worker) (jetstream.KeyValue, error) {
	want := bucketConfig(wc)
	kv, err := js.KeyValue(ctx, wc.Results)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, want)
		if err != nil {
			if kv2, err2 := js.KeyValue(ctx, wc.Results); err2 == nil { // another worker created it first
				kv, err = kv2, nil
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("results bucket %s: %w", wc.Results, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("results bucket %s: %w", wc.Results, err)
	}
	var bad []string
	if st.TTL() != want.TTL {
		bad = append(bad, fmt.Sprintf("ttl %s, not worker.result_ttl %s", st.TTL(), want.TTL))
	}
	if kst, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		if r := kst.StreamInfo().Config.Replicas; r != want.Replicas {
			bad = append(bad, fmt.Sprintf("%d replicas, not worker.replicas %d", r, want.Replicas))
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("results bucket %s exists with incompatible settings: %s (remove it or fix the worker config)", wc.Results, strings.Join(bad, "; "))
	}
	return kv, nil
}

// OpenBucket opens the results bucket without creating it, for clients.
func OpenBucket(ctx context.Context, js jetstream.JetStream, wc config.Worker) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, wc.Results)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("results bucket %s not found: no agentrun worker has started on this NATS yet", wc.Results)
	}
	if err != nil {
		return nil, fmt.Errorf("results bucket %s: %w", wc.Results, err)
	}
	return kv, nil
}
