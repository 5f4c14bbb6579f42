package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
)

// testPKI writes a CA and, signed by it, a server certificate for
// 127.0.0.1 and a client certificate, as PEM files in dir.
func testPKI(t *testing.T, dir string) (ca, srvCert, srvKey, cliCert, cliKey string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentrun test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	ca = write("ca.pem", "CERTIFICATE", caDER)
	srvCert, srvKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	cliCert, cliKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return
}

// TestWorkerMutualTLS: against a nats-server that requires TLS with client
// certificates, a worker with worker.tls runs tasks; without its client
// certificate it does not start, and says why.
func TestWorkerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, srvCert, srvKey, cliCert, cliKey := testPKI(t, dir)
	ns := startNATS(t, "--tls", "--tlscert", srvCert, "--tlskey", srvKey, "--tlscacert", ca, "--tlsverify")
	url := fmt.Sprintf("tls://127.0.0.1:%d", ns.port)
	tlsConf := map[string]any{"ca": ca, "cert": cliCert, "key": cliKey}
	w := startWorker(t, map[string]any{"nats": []string{url}, "tls": tlsConf, "slots": 1})

	wc := config.Default().Worker
	wc.NATS, wc.TLS = []string{url}, config.WorkerTLS{CA: ca, Cert: cliCert, Key: cliKey}
	b := dialWith(t, wc)
	b.publish("tls-1", `{"id":"tls-1","command":["echo","over tls"]}`)
	if res := b.results([]string{"tls-1"}, 20*time.Second)["tls-1"]; res.Stdout != "over tls\n" {
		t.Errorf("tls-1: %+v", res)
	}
	w.stop()

	cfg := map[string]any{"image": busyboxImage, "state_dir": stateDir, "audit": "",
		"worker": map[string]any{"nats": []string{url}, "tls": map[string]any{"ca": ca}}}
	out, err := exec.Command(agentrunBin(t), "worker", "--config", writeConfig(t, cfg)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "connecting to NATS") {
		t.Errorf("worker without a client certificate: %v: %s", err, out)
	}
	assertNoLeaks(t)
}
