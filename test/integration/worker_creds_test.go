package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/agentrun/agentrun/internal/config"
)

// operatorConfig writes a nats-server config in operator mode (an account
// with JetStream, in a memory resolver) and the creds file of one user of
// that account, and returns both paths.
func operatorConfig(t *testing.T, dir string) (serverConf, creds string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	ojwt, err := jwt.NewOperatorClaims(opub).Encode(okp)
	must(err)
	akp, err := nkeys.CreateAccount()
	must(err)
	apub, _ := akp.PublicKey()
	ac := jwt.NewAccountClaims(apub)
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	ajwt, err := ac.Encode(okp)
	must(err)
	// JetStream needs a system account.
	skp, err := nkeys.CreateAccount()
	must(err)
	spub, _ := skp.PublicKey()
	sjwt, err := jwt.NewAccountClaims(spub).Encode(okp)
	must(err)
	ukp, err := nkeys.CreateUser()
	must(err)
	upub, _ := ukp.PublicKey()
	ujwt, err := jwt.NewUserClaims(upub).Encode(akp)
	must(err)
	seed, _ := ukp.Seed()
	c, err := jwt.FormatUserConfig(ujwt, seed)
	must(err)
	creds = filepath.Join(dir, "agentrun.creds")
	must(os.WriteFile(creds, c, 0o600))
	serverConf = filepath.Join(dir, "server.conf")
	must(os.WriteFile(serverConf, []byte(fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %s\n  %s: %s\n}\n",
		ojwt, spub, apub, ajwt, spub, sjwt)), 0o600))
	return serverConf, creds
}

// TestWorkerCreds: against a nats-server in operator mode, a worker with
// worker.creds runs tasks; without them it does not start.
func TestWorkerCreds(t *testing.T) {
	conf, creds := operatorConfig(t, t.TempDir())
	ns := startNATS(t, "-c", conf)
	w := startWorker(t, map[string]any{"nats": []string{ns.url()}, "creds": creds, "slots": 1})

	wc := config.Default().Worker
	wc.NATS, wc.Creds = []string{ns.url()}, creds
	b := dialWith(t, wc)
	b.publish("creds-1", `{"id":"creds-1","command":["echo","with creds"]}`)
	if res := b.results([]string{"creds-1"}, 20*time.Second)["creds-1"]; res.Stdout != "with creds\n" {
		t.Errorf("creds-1: %+v", res)
	}
	w.stop()

	cfg := map[string]any{"image": busyboxImage, "state_dir": stateDir, "audit": "",
		"worker": map[string]any{"nats": []string{ns.url()}}}
	out, err := exec.Command(agentrunBin(t), "worker", "--config", writeConfig(t, cfg)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "connecting to NATS") {
		t.Errorf("worker without creds: %v: %s", err, out)
	}
	assertNoLeaks(t)
}
