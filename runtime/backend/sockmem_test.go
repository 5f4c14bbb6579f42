package backend

import (
	"os"
	"path/filepath"
	"testing"
)

func TestChargeSocketMemoryWithoutAccounting(t *testing.T) {
	dir := t.TempDir()
	if ok, err := ChargeSocketMemory(dir, 64<<20); ok || err != nil {
		t.Errorf("ChargeSocketMemory(dir without the file) = %v, %v; want false, nil", ok, err)
	}
	if _, err := os.Stat(filepath.Join(dir, tcpLimitFile)); err == nil {
		t.Error("ChargeSocketMemory created the limit file")
	}
	if _, err := ChargeSocketMemory(filepath.Join(dir, "gone"), 64<<20); err == nil {
		t.Error("ChargeSocketMemory(missing cgroup) = nil error")
	}
	if _, err := ChargeSocketMemory(dir, 0); err == nil {
		t.Error("ChargeSocketMemory(limit 0) = nil error")
	}
}
