package audit

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/agentrun/agentrun/internal/result"
)

func TestWriteAppendsOneLinePerRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "audit.jsonl")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			if err := l.Write(&Record{ID: "ar-" + string(rune('a'+i%26)), TaskHash: "sha256:x"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode = %v; want 0600", st.Mode().Perm())
	}
	f, _ := os.Open(path)
	defer f.Close()
	n := 0
	for sc := bufio.NewScanner(f); sc.Scan(); n++ {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %d is not a record: %v", n, err)
		}
		if r.TaskHash != "sha256:x" {
			t.Errorf("line %d: task_hash = %q", n, r.TaskHash)
		}
	}
	if n != 50 {
		t.Errorf("lines = %d; want 50", n)
	}
}

func TestOpenRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, nil, 0o600)
	link := filepath.Join(dir, "audit.jsonl")
	os.Symlink(target, link)
	if _, err := Open(link); err == nil {
		t.Fatal("Open followed a symlink")
	}
}

// TestLimitsJSON: the limits are one flat object, read back as written;
// an empty allowlist is left out.
func TestLimitsJSON(t *testing.T) {
	in := Limits{Values: map[string]float64{"timeout_ms": 5000, "memory": 256 << 20, "cpus": 0.5},
		NetworkAllow: []string{"pypi.org"}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"cpus":0.5,"memory":268435456,"network_allow":["pypi.org"],"timeout_ms":5000}`; string(b) != want {
		t.Errorf("limits JSON %s; want %s", b, want)
	}
	var out Limits
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out, in) {
		t.Errorf("read back %+v; want %+v", out, in)
	}
	if err := json.Unmarshal([]byte(`{"memory":"big"}`), &out); err == nil {
		t.Error("limits with a string value read without error")
	}
}

// fullRecord is a record with every kind of field set.
func fullRecord() *Record {
	return &Record{ID: "ar-1", Session: "s", TaskHash: "sha256:x", Image: "python", ImageDigest: "sha256:d",
		Runtime: "libcontainer", Limits: Limits{Values: map[string]float64{"memory": 1 << 28, "timeout_ms": 5000}, NetworkAllow: []string{"example.com"}},
		Network:  result.Network{Allowed: []result.Allowed{{Host: "example.com", Port: 443}}, Denied: []result.Denied{{Host: "evil.test", Reason: "not allowed"}}},
		ExitCode: 3, Signal: "SIGKILL", TimedOut: true, OOMKilled: true, DurationMS: 12, CPUMS: 5, MemoryPeakBytes: 4096,
		StdoutBytes: 7, StderrBytes: 8, Files: []string{"out/a"}, Error: "e", Detail: "d"}
}

// A log that discards its records (audit "") costs a run nothing: Write
// does not even encode the record.
func TestDiscardingLogEncodesNothing(t *testing.T) {
	l, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	rec := fullRecord()
	if n := testing.AllocsPerRun(10, func() {
		if err := l.Write(rec); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Write to a discarding log allocated %v times per record; want 0 (nothing encoded)", n)
	}
}

// A log that writes gets the whole record, every field as it was.
func TestWriteKeepsTheWholeRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	rec := fullRecord()
	if err := l.Write(rec); err != nil {
		t.Fatal(err)
	}
	l.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got Record
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if !reflect.DeepEqual(&got, rec) {
		t.Errorf("record read back = %+v\nwant %+v", got, *rec)
	}
}
