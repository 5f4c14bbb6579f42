package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/image"
	"github.com/agentrun/agentrun/image/imagetest"
)

// doctor checks that the default image can be had: in the store, on disk,
// or from a registry that answers; an image nobody can provide (an
// offline host's python:3.12-slim, here a registry that refuses
// connections) fails, with what to do.
func TestDoctorDefaultImage(t *testing.T) {
	bin := agentrunBin(t)
	store := newStoreDir(t)
	host := imagetest.Registry(t)
	imagetest.Push(t, host, "agentrun/busybox", "1", layoutImage(t, busyboxLayout(), "latest"))
	stored := "oci:" + busyboxLayout() + ":latest"
	st, err := image.Open(store)
	if err != nil {
		t.Fatal(err)
	}
	img, err := st.Get(context.Background(), stored, image.PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	img.Release()
	for _, tc := range []struct {
		name, ref string
		fail      bool
		want      []string
	}{
		{"in the store", stored, false, []string{"in the store"}},
		{"dir", busyboxImage, false, []string{"root filesystem on disk"}},
		{"registry answers", host + "/agentrun/busybox:1", false, []string{"its registry answers"}},
		{"registry down", "127.0.0.1:1/agentrun/busybox:1", true, []string{"registry unreachable", "agentrun pull 127.0.0.1:1/agentrun/busybox:1"}},
		{"not found", host + "/agentrun/none:1", true, []string{"image not found", "agentrun pull"}},
		{"missing layout", "oci:" + filepath.Join(t.TempDir(), "none"), true, []string{"image not found"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := writeConfig(t, map[string]any{"image": tc.ref, "state_dir": stateDir, "store_dir": store})
			out, err := exec.Command(bin, "doctor", "--config", cfg).CombinedOutput()
			var line string
			for _, l := range strings.Split(string(out), "\n") {
				if strings.HasPrefix(l, "image ") {
					line = l
				}
			}
			if tc.fail {
				if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(line, "FAIL") {
					t.Errorf("doctor: %v, image line %q; want FAIL and exit 1\n%s", err, line, out)
				}
			} else if err != nil || !strings.Contains(line, " ok ") {
				t.Errorf("doctor: %v, image line %q; want ok\n%s", err, line, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("doctor output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	if l := storeList(t, store); len(l) != 1 {
		t.Errorf("doctor changed the store: %+v", l)
	}
}
