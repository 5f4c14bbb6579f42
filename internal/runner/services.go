package runner

import (
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentrun/agentrun/internal/cleanup"
	"github.com/agentrun/agentrun/internal/netpolicy"
	"github.com/agentrun/agentrun/internal/task"
	"github.com/agentrun/agentrun/runtime/spec"
)

// CADir is where a run with services finds the proxy's CA: ca.pem (the
// run's CA alone) and bundle.pem (the image's roots and the run's CA).
const CADir = "/etc/agentrun-ca"

// systemBundles are the system CA bundles of common distributions; each
// that the image has as a regular file is replaced, read-only, by the
// bundle.
var systemBundles = []string{
	"etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine
	"etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"etc/ssl/ca-bundle.pem",             // openSUSE
	"etc/ssl/cert.pem",                  // Alpine, BSD-style
}

// Bounds of what a run reads to build its trust: the image's bundle and
// each of network.ca_files.
const (
	maxBundleBytes = 4 << 20
	maxCAFileBytes = 1 << 20
)

// services returns p's services as the config validated them when it was
// loaded (config.Network.ProxyService), the roots their upstreams are
// verified against (nil: the host's) and the approval timeout.
func (r *Runner) services(p *task.Plan) ([]*netpolicy.Service, *x509.CertPool, time.Duration, error) {
	if len(p.Services) == 0 {
		return nil, nil, 0, nil
	}
	var out []*netpolicy.Service
	for _, name := range p.Services {
		s, ok := r.cfg.Network.ProxyService(name)
		if !ok {
			return nil, nil, 0, fmt.Errorf("service %q is not in the config", name)
		}
		out = append(out, s)
	}
	timeout := r.cfg.Network.ApprovalTimeout.Duration()
	if len(r.cfg.Network.CAFiles) == 0 {
		return out, nil, timeout, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	for _, f := range r.cfg.Network.CAFiles {
		b, err := readBounded(f, maxCAFileBytes)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("config network.ca_files: %w", err)
		}
		if !roots.AppendCertsFromPEM(b) {
			return nil, nil, 0, fmt.Errorf("config network.ca_files: %s holds no PEM certificate", f)
		}
	}
	return out, roots, timeout, nil
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, path, max)
}

// trustCA writes the run's CA and a bundle of it with the image's roots
// into the run's etc tmpfs in dir (writeEtc), and returns the spec options
// that show them to the sandbox, read-only: CADir, the image's system
// bundles, and the variables SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
// CURL_CA_BUNDLE, PIP_CERT and GIT_SSL_CAINFO (the bundle) and
// NODE_EXTRA_CA_CERTS (the CA). The image is read through os.Root: a
// symlink never leads out of it.
func trustCA(ca []byte, rootfs, dir string, undo *cleanup.Cleanup) ([]spec.SpecOpt, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("opening the run's rootfs: %w", err)
	}
	defer root.Close()
	var system []byte
	var over []string
	for _, p := range systemBundles {
		fi, err := root.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		over = append(over, "/"+p)
		if system != nil {
			continue
		}
		if system, err = readImageFile(root, p, maxBundleBytes); err != nil {
			return nil, fmt.Errorf("the image's CA bundle: %w", err)
		}
	}
	bundle := append(append([]byte(nil), system...), '\n')
	bundle = append(bundle, ca...)
	caPath, err := writeEtc(dir, undo, "ca/ca.pem", ca)
	if err != nil {
		return nil, fmt.Errorf("writing the run's CA: %w", err)
	}
	bundlePath, err := writeEtc(dir, undo, "ca/bundle.pem", bundle)
	if err != nil {
		return nil, fmt.Errorf("writing the run's CA bundle: %w", err)
	}
	b := CADir + "/bundle.pem"
	opts := []spec.SpecOpt{
		spec.WithReadonlyFile(filepath.Dir(caPath), CADir),
		spec.WithEnv(map[string]string{
			"SSL_CERT_FILE": b, "REQUESTS_CA_BUNDLE": b, "CURL_CA_BUNDLE": b, "PIP_CERT": b, "GIT_SSL_CAINFO": b,
			"NODE_EXTRA_CA_CERTS": CADir + "/ca.pem",
		}),
	}
	for _, p := range over {
		opts = append(opts, spec.WithReadonlyFile(bundlePath, p))
	}
	return opts, nil
}
