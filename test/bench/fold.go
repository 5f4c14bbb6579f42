package main

import (
	"bufio"
	"cmp"
	"debug/elf"
	"debug/gosym"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

var foldPerf = flag.String("fold-perf", "", "fold the stacks of this `perf script` output (one line per stack, outermost frame first, then its count) to stdout, naming the frames of the -agentrun binary perf could not, and exit")

// symtab names the addresses of one ELF binary's functions: Go's from its
// line table (which a stripped binary keeps too), the others (cgo's C,
// libseccomp's) from its symbol table where it has one.
type symtab struct {
	gotab *gosym.Table
	addrs []uint64
	names []string
}

// loadSymtab reads bin's function symbols.
func loadSymtab(bin string) (*symtab, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := &symtab{}
	syms, _ := f.Symbols() // none in a stripped binary
	slices.SortFunc(syms, func(a, b elf.Symbol) int { return cmp.Compare(a.Value, b.Value) })
	// Go's code starts at runtime.text, which in an externally linked
	// (cgo) binary is past the C code at the start of .text.
	var goText uint64
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
			st.addrs, st.names = append(st.addrs, s.Value), append(st.names, s.Name)
		}
		if s.Name == "runtime.text" {
			goText = s.Value
		}
	}
	if pcln, text := f.Section(".gopclntab"), f.Section(".text"); pcln != nil && text != nil {
		if goText == 0 {
			goText = text.Addr
		}
		data, err := pcln.Data()
		if err != nil {
			return nil, err
		}
		if st.gotab, err = gosym.NewTable(nil, gosym.NewLineTable(data, goText)); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// name is the function at address a, "" if none.
func (st *symtab) name(a uint64) string {
	if st.gotab != nil {
		if fn := st.gotab.PCToFunc(a); fn != nil {
			return fn.Name
		}
	}
	i := sort.Search(len(st.addrs), func(i int) bool { return st.addrs[i] > a }) - 1
	if i < 0 {
		return ""
	}
	return st.names[i]
}

// textBase is where a non-PIE amd64 Go binary is loaded: perf gives the
// frames of a binary it cannot open as offsets from it.
const textBase = 0x400000

// fold reads `perf script` output (a header line per sample, then one
// "ip symbol (dso)" line per frame, innermost first, then a blank line)
// and writes each distinct stack once, "comm;outermost;...;innermost
// count", most frequent first. A frame perf left [unknown] gets its dso's
// base name in brackets, or, when the dso is bin (a container's init
// runs it from a sealed copy that perf cannot open: "/agentrun" in a
// detached overlay mount), its function's name from bin's symbols. Only
// the processes that run bin's code get those names (bin itself, a
// container's init before nsexec names it, executed from a descriptor:
// "7", and libcontainer's init stages, "runc:[N:...]"): the frames of a program
// without frame pointers (python3) are stray return addresses, and perf
// may place one in a map its process no longer has.
func fold(r io.Reader, w io.Writer, st *symtab, bin string) error {
	counts := map[string]int{}
	binName := filepath.Base(bin)
	var comm string
	var names *symtab // st for a sample of a process that runs bin's code
	var stack []string
	flush := func() {
		if comm != "" && len(stack) > 0 {
			s := comm
			for i := len(stack) - 1; i >= 0; i-- {
				s += ";" + stack[i]
			}
			counts[s]++
		}
		comm, stack = "", stack[:0]
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] != ' ' && line[0] != '\t':
			if f := strings.Fields(line); len(f) > 0 {
				comm = f[0]
			}
			names = nil
			if comm == binName || strings.HasPrefix(comm, "runc:[") || strings.Trim(comm, "0123456789") == "" {
				names = st
			}
		default:
			stack = append(stack, frame(strings.Fields(line), names, binName, len(stack) == 0))
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return err
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if counts[a] != counts[b] {
			return counts[b] - counts[a]
		}
		return strings.Compare(a, b)
	})
	bw := bufio.NewWriter(w)
	for _, k := range keys {
		fmt.Fprintf(bw, "%s %d\n", k, counts[k])
	}
	return bw.Flush()
}

// frame names one frame: "ip symbol+off (dso)" split in fields. A
// symbol's own spaces (Go's generic shapes have some) are dropped, so that
// the count stays the last field of a folded line and the stack the first.
// Every frame but the innermost (leaf) is a return address, the
// instruction after a call, which for a call that ends its function is
// the next function's first: it is looked up one byte back.
func frame(f []string, st *symtab, binName string, leaf bool) string {
	if len(f) < 2 {
		return "[unknown]"
	}
	sym := f[1]
	if len(f) > 3 {
		sym = strings.Join(f[1:len(f)-1], "")
	}
	sym, _, _ = strings.Cut(sym, "+0x")
	if sym != "[unknown]" {
		return sym
	}
	dso := strings.Trim(f[len(f)-1], "()")
	if filepath.Base(dso) == binName && st != nil {
		if ip, err := strconv.ParseUint(f[0], 16, 64); err == nil {
			if !leaf && ip > 0 {
				ip--
			}
			if n := st.name(ip + textBase); n != "" {
				return n
			}
		}
	}
	if strings.HasPrefix(dso, "[") {
		return dso // [kernel.kallsyms], [unknown]
	}
	return "[" + filepath.Base(dso) + "]"
}

// runFold is -fold-perf: it folds the file and exits.
func runFold(path, bin string) {
	st, err := loadSymtab(bin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: symbols of %s: %v (its frames stay unnamed)\n", bin, err)
	}
	in, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	defer in.Close()
	if err := fold(in, os.Stdout, st, bin); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
