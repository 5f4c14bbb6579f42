package workspace

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentrun/agentrun/internal/result"
)

// Bounds of one Collect. The walk stops at the first one reached, and the
// result's collect.cut names it: what was found until then is returned.
const (
	MaxCollectBytes   = 16 << 20        // file content in one result, in all
	MaxCollectFiles   = 1000            // matches listed, files or not
	MaxCollectEntries = 100_000         // directory entries looked at
	MaxCollectTime    = 5 * time.Second // walking and reading, in all
	readDirBatch      = 256             // entries read from a directory at once
)

// Limits bound one Collect; the zero value means the package's maxima.
type Limits struct {
	Bytes   int64
	Files   int
	Entries int
	Time    time.Duration
}

func (l Limits) orDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = MaxCollectBytes
	}
	if l.Files <= 0 {
		l.Files = MaxCollectFiles
	}
	if l.Entries <= 0 {
		l.Entries = MaxCollectEntries
	}
	if l.Time <= 0 {
		l.Time = MaxCollectTime
	}
	return l
}

// errCut stops a walk at a bound; walker.cut says which.
var errCut = errors.New("collect bound reached")

// walker matches globs against the workspace through its safefs.Dir. It
// never follows a symbolic link: a link is a match like any other entry
// (listed with an error), and never a directory to descend into, so a
// link loop costs one entry.
type walker struct {
	w        *Workspace
	lim      Limits
	deadline time.Time
	entries  int
	matches  map[string]bool
	cut      string
}

// Collect returns the regular files matching globs (workspace-relative,
// path.Match syntax per component), and a report of the patterns that
// matched nothing and of the bound, if any, that cut the walk short. A
// match that is not a regular file (a symlink, a fifo, a directory) is
// listed with an error and never opened through.
func (w *Workspace) Collect(globs []string, lim Limits) (map[string]result.File, *result.Collect, error) {
	for _, g := range globs {
		if _, err := path.Match(g, ""); err != nil {
			return nil, nil, fmt.Errorf("collect %q: %w", g, err)
		}
	}
	lim = lim.orDefaults()
	wk := &walker{w: w, lim: lim, deadline: time.Now().Add(lim.Time), matches: map[string]bool{}}
	rep := &result.Collect{Unmatched: []string{}}
	for _, g := range globs {
		found, err := wk.glob(".", strings.Split(g, "/"))
		if errors.Is(err, errCut) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("collect %q: %w", g, err)
		}
		if !found {
			rep.Unmatched = append(rep.Unmatched, g)
		}
	}
	names := make([]string, 0, len(wk.matches))
	for n := range wk.matches {
		names = append(names, n)
	}
	slices.Sort(names)
	files := make(map[string]result.File, len(names))
	budget := lim.Bytes
	var escaped []string
	for _, name := range names {
		f := wk.collectOne(name, &budget)
		if !utf8.ValidString(name) {
			f.NameBase64 = base64.StdEncoding.EncodeToString([]byte(name))
			escaped = append(escaped, name)
			files[name] = f // keyed below, once every valid name is in
			continue
		}
		files[name] = f
	}
	for _, name := range escaped {
		f := files[name]
		delete(files, name)
		files[escapedKey(name, files)] = f
	}
	rep.Cut = wk.cut
	return files, rep, nil
}

// escapedKey is the result key of a name that is not valid UTF-8 (which
// JSON cannot carry): each byte of an invalid sequence written as \xNN,
// and " (2)", " (3)"... appended should that key be taken by another file.
func escapedKey(name string, taken map[string]result.File) string {
	var b strings.Builder
	for i := 0; i < len(name); {
		r, n := utf8.DecodeRuneInString(name[i:])
		if r == utf8.RuneError && n <= 1 {
			fmt.Fprintf(&b, `\x%02x`, name[i])
			i++
			continue
		}
		b.WriteString(name[i : i+n])
		i += n
	}
	key := b.String()
	for k := 2; ; k++ {
		if _, ok := taken[key]; !ok {
			return key
		}
		key = fmt.Sprintf("%s (%d)", b.String(), k)
	}
}

// visit counts one directory entry against the bounds.
func (wk *walker) visit() error {
	wk.entries++
	switch {
	case wk.entries > wk.lim.Entries:
		wk.cut = fmt.Sprintf("%d directory entries looked at", wk.lim.Entries)
	case wk.entries%64 == 0 && time.Now().After(wk.deadline):
		wk.cut = fmt.Sprintf("%v spent", wk.lim.Time)
	default:
		return nil
	}
	return errCut
}

// match records name as a match, within the file bound.
func (wk *walker) match(name string) error {
	if wk.matches[name] {
		return nil
	}
	if len(wk.matches) >= wk.lim.Files {
		wk.cut = fmt.Sprintf("%d files", wk.lim.Files)
		return errCut
	}
	wk.matches[name] = true
	return nil
}

// glob matches the pattern components comps under dir, a directory
// reached without following a link. It reports whether anything matched.
func (wk *walker) glob(dir string, comps []string) (bool, error) {
	comp, last := comps[0], len(comps) == 1
	if comp == "" || comp == "." {
		if last {
			return false, nil
		}
		return wk.glob(dir, comps[1:])
	}
	if !hasMeta(comp) {
		name := path.Join(dir, comp)
		if err := wk.visit(); err != nil {
			return false, err
		}
		fi, err := wk.w.root.Lstat(name)
		if err != nil {
			return false, nil // absent: no match
		}
		if last {
			return true, wk.match(name)
		}
		if !fi.IsDir() {
			return false, nil
		}
		return wk.glob(name, comps[1:])
	}
	d, err := wk.w.root.Sub(dir)
	if err != nil {
		return false, nil
	}
	defer d.Close()
	found := false
	var subdirs []string
	for {
		ents, err := d.ReadDir(readDirBatch)
		for _, e := range ents {
			if verr := wk.visit(); verr != nil {
				return found, verr
			}
			if ok, _ := path.Match(comp, e.Name()); !ok || e.Name() == "." || e.Name() == ".." {
				continue
			}
			name := path.Join(dir, e.Name())
			if last {
				found = true
				if merr := wk.match(name); merr != nil {
					return found, merr
				}
			} else if e.Type().IsDir() { // a link to a directory is not one
				subdirs = append(subdirs, name)
			}
		}
		if err == io.EOF || len(ents) == 0 {
			break
		}
		if err != nil {
			return found, nil
		}
	}
	d.Close()
	slices.Sort(subdirs)
	for _, sub := range subdirs {
		ok, err := wk.glob(sub, comps[1:])
		found = found || ok
		if err != nil {
			return found, err
		}
	}
	return found, nil
}

// collectOne reads name, a match, within the byte budget.
func (wk *walker) collectOne(name string, budget *int64) result.File {
	fi, err := wk.w.root.Lstat(name)
	if err != nil {
		return result.File{Error: "cannot stat: " + reason(err)}
	}
	if !fi.Mode().IsRegular() {
		return result.File{Error: "not a regular file (" + fi.Mode().Type().String() + ")"}
	}
	// The program is dead, but safefs never blocks on a fifo or follows a
	// link that replaced the file.
	f, err := wk.w.root.Open(name)
	if err != nil {
		return result.File{Error: "cannot open: " + reason(err)}
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return result.File{Error: "not a regular file"}
	}
	size := fi.Size()
	if *budget <= 0 {
		return result.File{Size: size, Truncated: size > 0, Error: "collect limit reached"}
	}
	data, err := io.ReadAll(io.LimitReader(f, *budget))
	if err != nil {
		return result.File{Size: size, Error: "read error"}
	}
	*budget -= int64(len(data))
	return result.File{
		Size:          size,
		ContentBase64: base64.StdEncoding.EncodeToString(data),
		Truncated:     int64(len(data)) < size,
	}
}

// hasMeta reports whether a pattern component has glob syntax.
func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }
