package main

import (
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestFold: stacks are folded outermost first and counted; a frame perf
// named keeps its name, offset dropped; an unnamed one of the binary gets
// its function's name from the binary's symbols (perf's offset plus the
// text base), and an unnamed one of another dso that dso's name.
func TestFold(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	st, err := loadSymtab(exe)
	if err != nil {
		t.Fatal(err)
	}
	off := strconv.FormatUint(uint64(reflect.ValueOf(fold).Pointer())-textBase+3, 16)
	sample := "runc:[2:INIT] 1234 [000] 1.0: 1 cpu-clock:\n" +
		"\t" + off + " [unknown] (/bench.test)\n" +
		"\t1000 runtime.main+0x40 (/usr/bin/agentrun)\n" +
		"\t2000 iter.Pull[go.shape.int, go.shape.string]+0x1 (/usr/bin/agentrun)\n" +
		"\tffff [unknown] ([kernel.kallsyms])\n\n"
	var out strings.Builder
	if err := fold(strings.NewReader(sample+sample+"python3 1 [001] 2.0: 1 cpu-clock:\n\t10 [unknown] (/usr/bin/python3.11)\n\t"+off+" [unknown] (/bench.test)\n\n"), &out, st, "/bench.test"); err != nil {
		t.Fatal(err)
	}
	name := runtime.FuncForPC(reflect.ValueOf(fold).Pointer()).Name()
	want := "runc:[2:INIT];[kernel.kallsyms];iter.Pull[go.shape.int,go.shape.string];runtime.main;" + name + " 2\npython3;[bench.test];[python3.11] 1\n"
	if out.String() != want {
		t.Errorf("folded:\n%s\nwant:\n%s", out.String(), want)
	}
}
