package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentrun/agentrun/internal/audit"
)

// A run that collects as many files as collect allows (1,000), with
// names as long as a file name may be, writes one audit line of at most
// 64 KiB (it used to echo every name: a quarter of a megabyte here, and
// megabytes with nested names), which says how many names there were.
func TestAuditRecordOfManyCollectedFilesIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	log, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	const n = 1000
	res := runTaskWith(t, testConfig(t), log, pyTask(`import os
os.mkdir("out")
for i in range(1000):
    open("out/%05d-%s" % (i, "n" * 249), "w").close()
`, map[string]any{"collect": []string{"out/*"}, "limits": map[string]any{"timeout": "30s"}}))
	if len(res.Files) != n {
		t.Fatalf("collected %d files; want %d", len(res.Files), n)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > audit.MaxRecordBytes || bytes.Count(b, []byte("\n")) != 1 {
		t.Fatalf("audit log holds %d bytes in %d lines; want one line of at most %d", len(b), bytes.Count(b, []byte("\n")), audit.MaxRecordBytes)
	}
	var rec audit.Record
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Truncated == nil || rec.Truncated.Files != n || len(rec.Files) == 0 || rec.ID != res.ID {
		t.Errorf("record %s: %d names kept, truncated %+v; want the count %d", rec.ID, len(rec.Files), rec.Truncated, n)
	}
}
