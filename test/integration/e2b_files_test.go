package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
)

// TestE2BFiles: through the SDK's files, a sandbox's files are written
// and read (text, bytes, several at once, octet-stream) in /workspace
// (the home: relative paths land there) and /tmp, listed with depth,
// stat'ed, made, renamed, removed and watched with their events; its
// signed upload and download URLs work with no other credential, and a
// URL for another path or without its signature is refused; a link or a
// fifo planted inside never leads a read out or blocks it, and a write
// over a link replaces it. The host file the links name is untouched.
func TestE2BFiles(t *testing.T) { eachRuntime(t, testE2BFiles) }

func testE2BFiles(t *testing.T, rt string) {
	s := startE2B(t, []string{"alice"}, map[string]any{"runtime": rt})
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host-secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	seen := s.node(t, s.keys["alice"], "files.mjs", secret)
	// want is each value the script saw, as JSON.
	want := map[string]string{
		"written":              `{"name":"hello.txt","path":"/workspace/notes/hello.txt","type":"file"}`,
		"readText":             `"hello e2b"`,
		"readBytes":            `[0,1,2,255,254]`,
		"multi":                `["/workspace/m/a.txt","/workspace/m/b/c.txt"]`,
		"octet":                `"octet"`,
		"inside":               `"hello e2bACCoctet 0 1 2 255 254"`,
		"list1":                `[["a.txt","file","/workspace/m/a.txt"],["b","dir","/workspace/m/b"]]`,
		"list2":                `["/workspace/m/a.txt","/workspace/m/b","/workspace/m/b/c.txt"]`,
		"exists":               `[true,false,true]`,
		"info":                 `{"name":"c.txt","type":"file","path":"/workspace/m/b/c.txt","size":2,"owner":"user","permissions":"-rw-r--r--","mtime":true}`,
		"makeDir":              `[true,false]`,
		"renamed":              `"/workspace/x/y/a2.txt"`,
		"afterRename":          `[false,"A"]`,
		"removed":              `false`,
		"uploadStatus":         `200`,
		"uploaded":             `"uploaded"`,
		"download":             `[200,"uploaded"]`,
		"downloadExpiring":     `[200,"uploaded"]`,
		"forgedStatus":         `401`,
		"unsignedStatus":       `401`,
		"readSignatureToWrite": `401`,
		"deepThroughLink":      `0`,
		"linkInfo":             `{"type":"symlink","symlinkTarget":"` + secret + `"}`,
		"downloadLink":         `[400,false]`,
		"afterWriteOverLink":   `"pwned"`,
		"polled":               `["1:p.txt"]`,
	}
	for name, w := range want {
		var got bytes.Buffer
		if err := json.Compact(&got, seen[name]); err != nil || got.String() != w {
			t.Errorf("%s: got %s, want %s", name, seen[name], w)
		}
	}
	// Errors, by the SDK's classes. Under gVisor a fifo made inside is
	// the sentry's alone (runsc's gofer makes none on the host): the
	// host finds no file to read, so it cannot block there either.
	fifoClass := "InvalidArgumentError"
	if rt == config.RuntimeRunsc {
		fifoClass = "FileNotFoundError"
	}
	for name, class := range map[string]string{
		"readMissing": "FileNotFoundError", "outside": "InvalidArgumentError", "outsideList": "InvalidArgumentError",
		"readLink": "InvalidArgumentError", "readLinkWs": "InvalidArgumentError", "readThroughDirLink": "InvalidArgumentError",
		"listDirLink": "InvalidArgumentError", "readFifo": fifoClass,
	} {
		var got struct{ Error, Message string }
		e2bGot(t, seen, name, &got)
		if got.Error != class || strings.Contains(got.Message, "host-secret") {
			t.Errorf("%s: %+v, want a %s", name, got, class)
		}
	}
	var home struct{ Error, Message string }
	e2bGot(t, seen, "home", &home)
	if home.Error != "InvalidArgumentError" || !strings.Contains(home.Message, "/home/user, is /workspace") {
		t.Errorf("a write in /home/user: %+v, want an InvalidArgumentError saying the home is /workspace", home)
	}
	// Watchers: bounded, gone once removed, of a directory alone (Connect
	// codes: resource_exhausted, not_found, invalid_argument).
	for name, code := range map[string]string{"watcher17": "[resource_exhausted]", "afterRemoveWatcher": "[not_found]", "watchAFile": "[invalid_argument]"} {
		var got struct{ Error, Message string }
		e2bGot(t, seen, name, &got)
		if got.Error != "ConnectError" || !strings.HasPrefix(got.Message, code) {
			t.Errorf("%s: %+v, want a ConnectError %s", name, got, code)
		}
	}
	// Bounds: a file past 16 MiB is 413, no room 507 (the SDK's
	// NotEnoughSpaceError); a watch ends with its sandbox.
	for name, want := range map[string]string{"tooLarge": "SandboxError:413", "tooLargeOctet": "SandboxError:413", "noRoom": "NotEnoughSpaceError:"} {
		var got struct{ Error, Message string }
		e2bGot(t, seen, name, &got)
		class, msg, _ := strings.Cut(want, ":")
		if got.Error != class || !strings.HasPrefix(got.Message, msg) {
			t.Errorf("%s: %+v, want a %s", name, got, want)
		}
	}
	var watchExit *string
	e2bGot(t, seen, "watchExit", &watchExit)
	if watchExit == nil {
		t.Errorf("a watch did not end with its sandbox")
	} else {
		t.Logf("the watch ended with its sandbox: %s", *watchExit)
	}
	// The watch saw each change, named below the directory watched.
	var events []string
	e2bGot(t, seen, "events", &events)
	for _, ev := range []string{"create:new.txt", "create:sub", "create:sub/z.txt", "remove:new.txt"} {
		found := false
		for _, e := range events {
			found = found || e == ev
		}
		if !found {
			t.Errorf("watchDir: no %s among %q", ev, events)
		}
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "host-secret" {
		t.Errorf("the host file the planted links name: %q, %v", b, err)
	}
	s.stop()
	assertNoLeaks(t)
}
