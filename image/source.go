package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/agentrun/agentrun/internal/errkind"
)

// refNameAnnotation is the OCI layout annotation that names a manifest.
const refNameAnnotation = "org.opencontainers.image.ref.name"

func wantPlatform(opts PullOptions) v1.Platform {
	if opts.Platform != nil {
		return *opts.Platform
	}
	return v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
}

func platformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// matches reports whether an image of platform have runs where want is
// asked for. An unset wanted variant matches any.
func matches(have, want v1.Platform) bool {
	return have.OS == want.OS && have.Architecture == want.Architecture &&
		(want.Variant == "" || have.Variant == "" || have.Variant == want.Variant)
}

// resolve finds the single-platform image that r names, without fetching
// its layers.
func (s *Store) resolve(ctx context.Context, r reference, p v1.Platform, tr http.RoundTripper) (v1.Image, error) {
	var img v1.Image
	var err error
	switch r.kind {
	case kindRemote:
		img, err = s.resolveRemote(ctx, r, p, tr)
	case kindLayout:
		img, err = resolveLayout(r, p)
	case kindArchive:
		img, err = tarball.ImageFromPath(r.path, nil)
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: %v", ErrNotFound, err)
		}
	default:
		return nil, fmt.Errorf("resolving %q: not a pullable reference", r.raw)
	}
	if err != nil {
		return nil, fmt.Errorf("resolving %q: %w", r.raw, err)
	}
	var cf *v1.ConfigFile
	if err := s.retry(ctx, "fetching image config", func() (err error) {
		cf, err = img.ConfigFile()
		return err
	}); err != nil {
		return nil, fmt.Errorf("resolving %q: %w", r.raw, err)
	}
	have := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	if !matches(have, p) {
		return nil, fmt.Errorf("%w: %q is %s, want %s", ErrPlatform, r.raw, platformString(have), platformString(p))
	}
	return img, nil
}

func (s *Store) remoteOptions(ctx context.Context, p v1.Platform, tr http.RoundTripper) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithTransport(tr),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(p),
		// One try per call: Store.retry owns the retries and their errors.
		remote.WithRetryBackoff(remote.Backoff{Steps: 1}),
	}
}

func (s *Store) resolveRemote(ctx context.Context, r reference, p v1.Platform, tr http.RoundTripper) (v1.Image, error) {
	var desc *remote.Descriptor
	if err := s.retry(ctx, "fetching manifest", func() (err error) {
		desc, err = remote.Get(r.remote, s.remoteOptions(ctx, p, tr)...)
		return err
	}); err != nil {
		return nil, err
	}
	if !desc.MediaType.IsIndex() {
		return desc.Image()
	}
	idx, err := desc.ImageIndex()
	if err != nil {
		return nil, err
	}
	var img v1.Image
	err = s.retry(ctx, "fetching platform manifest", func() (err error) {
		img, err = pickPlatform(idx, p)
		return err
	})
	return img, err
}

// pickPlatform returns the image in idx built for p.
func pickPlatform(idx v1.ImageIndex, p v1.Platform) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading index: %w", err)
	}
	var have []string
	for _, m := range im.Manifests {
		if m.Platform == nil || !m.MediaType.IsImage() {
			continue
		}
		if matches(*m.Platform, p) {
			return idx.Image(m.Digest)
		}
		have = append(have, platformString(*m.Platform))
	}
	return nil, fmt.Errorf("%w: no image for %s in index (has %s)", ErrPlatform, platformString(p), strings.Join(have, ", "))
}

func resolveLayout(r reference, p v1.Platform) (v1.Image, error) {
	lp, err := layout.FromPath(r.path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: no OCI layout at %s", ErrNotFound, r.path)
		}
		return nil, fmt.Errorf("opening OCI layout: %w", err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("opening OCI layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading OCI layout index: %w", err)
	}
	var found []v1.Descriptor
	var tags []string
	for _, m := range im.Manifests {
		tag := m.Annotations[refNameAnnotation]
		if tag != "" {
			tags = append(tags, tag)
		}
		if r.tag == "" || tag == r.tag {
			found = append(found, m)
		}
	}
	slices.Sort(tags)
	switch {
	case len(found) == 0 && r.tag != "":
		return nil, fmt.Errorf("%w: no manifest tagged %q in %s (tags: %s)", ErrNotFound, r.tag, r.path, strings.Join(tags, ", "))
	case len(found) == 0:
		return nil, fmt.Errorf("%w: OCI layout %s is empty", ErrNotFound, r.path)
	case len(found) > 1:
		// Several images under one name: keep the one for p, if only one is.
		var plat []v1.Descriptor
		for _, m := range found {
			if m.Platform != nil && matches(*m.Platform, p) {
				plat = append(plat, m)
			}
		}
		if len(plat) != 1 {
			return nil, fmt.Errorf("%w %q: layout holds %d manifests, name one with oci:PATH:TAG (tags: %s)",
				ErrBadReference, r.raw, len(found), strings.Join(tags, ", "))
		}
		found = plat
	}
	d := found[0]
	switch {
	case d.MediaType.IsIndex():
		child, err := lp.ImageIndex()
		if err == nil {
			child, err = child.ImageIndex(d.Digest)
		}
		if err != nil {
			return nil, fmt.Errorf("opening nested index %s: %w", d.Digest, err)
		}
		return pickPlatform(child, p)
	case d.MediaType.IsImage():
		return lp.Image(d.Digest)
	default:
		return nil, fmt.Errorf("manifest %s has unsupported media type %q", d.Digest, d.MediaType)
	}
}

// retry runs f until it succeeds, fails for good, or s.Attempts tries are
// spent, waiting s.RetryWait then doubling between tries. It returns the
// last error wrapped with its kind (ErrNotFound, ErrUnauthorized,
// ErrUnreachable) and what was being done.
func (s *Store) retry(ctx context.Context, what string, f func() error) error {
	wait := s.retryWait()
	attempts := s.attempts()
	for try := 1; ; try++ {
		err := f()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if !transient(err) || try >= attempts {
			return classify(what, err, try)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (after %d attempts, last error: %v)", what, ctx.Err(), try, err)
		case <-t.C:
		}
		wait *= 2
	}
}

// transient reports errors worth another try: server errors, throttling,
// refused or reset connections, timeouts, truncated bodies, failed name
// lookups. A policy refusal never is.
func transient(err error) bool {
	if errors.Is(err, errkind.ErrPolicy) {
		return false
	}
	var de *net.DNSError
	if errors.As(err, &de) {
		return true
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return te.StatusCode >= 500 || te.StatusCode == http.StatusRequestTimeout || te.StatusCode == http.StatusTooManyRequests
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func classify(what string, err error, tries int) error {
	if errors.Is(err, errkind.ErrPolicy) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrPlatform) || errors.Is(err, ErrDigestMismatch) ||
		errors.Is(err, ErrTooLarge) || errors.Is(err, ErrUnsafeLayer) {
		return fmt.Errorf("%s: %w", what, err)
	}
	if msg := err.Error(); strings.Contains(msg, "error verifying") || strings.Contains(msg, "does not match expected size") {
		// go-containerregistry's digest and size checks (plain errors)
		return fmt.Errorf("%s: %w: %v", what, ErrDigestMismatch, err)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		has := func(codes ...transport.ErrorCode) bool {
			for _, d := range te.Errors {
				if slices.Contains(codes, d.Code) {
					return true
				}
			}
			return false
		}
		switch {
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			has(transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return fmt.Errorf("%s: %w (check credentials in the docker config): %v", what, ErrUnauthorized, err)
		case te.StatusCode == http.StatusNotFound ||
			has(transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("%s: %w: %v", what, ErrNotFound, err)
		case transient(err):
			return unreachable(what, err, tries)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	var ue *url.Error
	var oe *net.OpError
	var de *net.DNSError
	if transient(err) || errors.As(err, &ue) || errors.As(err, &oe) || errors.As(err, &de) {
		return unreachable(what, err, tries)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func unreachable(what string, err error, tries int) error {
	n := "attempts"
	if tries == 1 {
		n = "attempt"
	}
	return fmt.Errorf("%s: %w after %d %s: %v", what, ErrUnreachable, tries, n, err)
}
