package image

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

type refKind int

const (
	kindRemote refKind = iota
	kindLayout
	kindArchive
	kindDir
)

// reference is a parsed image reference.
type reference struct {
	raw  string // as the user wrote it
	kind refKind
	key  string // canonical form, the refs index key

	remote name.Reference // kindRemote
	path   string         // kindLayout, kindArchive, kindDir: absolute
	tag    string         // kindLayout: annotation to match, may be empty
}

// referenceForms says what an image reference looks like.
const referenceForms = "dir:/path/to/rootfs for an unpacked root filesystem, oci:/path/to/layout[:tag] for an OCI layout, " +
	"docker-archive:/path/to/image.tar for a docker save tarball, or a registry reference such as " +
	"python:3.12-slim, host:port/name:tag or host:port/name@sha256:..."

const (
	prefixLayout  = "oci:"
	prefixArchive = "docker-archive:"
	prefixDir     = "dir:"
)

// parseReference accepts "python:3.12-slim", "host:port/name:tag",
// "host:port/name@sha256:...", "oci:/path[:tag]", "docker-archive:/path.tar"
// and "dir:/path".
func parseReference(raw string) (reference, error) {
	r := reference{raw: raw}
	switch {
	case strings.HasPrefix(raw, prefixDir):
		p, err := absPath(raw, strings.TrimPrefix(raw, prefixDir))
		if err != nil {
			return r, err
		}
		r.kind, r.path, r.key = kindDir, p, prefixDir+p
	case strings.HasPrefix(raw, prefixLayout):
		rest := strings.TrimPrefix(raw, prefixLayout)
		// A tag is what follows the last ':' after the last '/'.
		if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
			rest, r.tag = rest[:i], rest[i+1:]
			if r.tag == "" {
				return r, fmt.Errorf("%w %q: empty tag", ErrBadReference, raw)
			}
		}
		p, err := absPath(raw, rest)
		if err != nil {
			return r, err
		}
		r.kind, r.path, r.key = kindLayout, p, prefixLayout+p
		if r.tag != "" {
			r.key += ":" + r.tag
		}
	case strings.HasPrefix(raw, prefixArchive):
		p, err := absPath(raw, strings.TrimPrefix(raw, prefixArchive))
		if err != nil {
			return r, err
		}
		r.kind, r.path, r.key = kindArchive, p, prefixArchive+p
	case strings.HasPrefix(raw, "/") || strings.HasPrefix(raw, ".") || strings.HasPrefix(raw, "~"):
		return r, fmt.Errorf("%w %q: a path is not an image reference; use %s", ErrBadReference, raw, referenceForms)
	default:
		ref, err := name.ParseReference(raw)
		if err != nil {
			return r, fmt.Errorf("%w %q: %v (image references look like %s)", ErrBadReference, raw, err, referenceForms)
		}
		r.kind, r.remote, r.key = kindRemote, ref, ref.Name()
	}
	return r, nil
}

func absPath(raw, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w %q: empty path", ErrBadReference, raw)
	}
	// Never relative to agentrun's working directory.
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("%w %q: the path must be absolute", ErrBadReference, raw)
	}
	return filepath.Clean(p), nil
}
