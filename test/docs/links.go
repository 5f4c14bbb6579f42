// Package docs checks agentrun's Markdown documentation against the
// repository: every relative link of README.md and docs/*.md must name a
// file or directory of the repository, and every #anchor a heading of the
// page it names, by GitHub's rules for heading anchors; and the layout
// table of docs/architecture.md must name every directory of Go files, and
// only paths that exist; docs/config.md's table of limits must be
// config.LimitTable and the built-in defaults, and docs/serve.md's table
// of what a reload applies config.ReloadTable (the tests check that). It
// never follows a link out of the repository and never reaches the
// network: absolute URLs are not checked.
package docs

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// A Link is one link of a Markdown file.
type Link struct {
	File   string // the file it is in, relative to the repository root
	Line   int    // 1-based
	Target string // as written
}

// A Broken is a link that does not resolve, and why.
type Broken struct {
	Link
	Reason string
}

func (b Broken) String() string {
	return fmt.Sprintf("%s:%d: link %q: %s", b.File, b.Line, b.Target, b.Reason)
}

var (
	// inline is [text](target) or ![alt](target), with an optional title;
	// text may wrap lines and hold no unescaped ']'.
	inline = regexp.MustCompile(`!?\[((?:\\.|[^\]\\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	// refDef is a reference definition: [label]: target.
	refDef = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?`)
	// scheme is an absolute URL's start (https:, mailto:, ...).
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// atx is an ATX heading: # text, with optional closing #s.
	atx = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	// setext is a setext heading's underline.
	setext = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	// fence opens or closes a fenced code block.
	fence = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")
	// htmlAnchor is an explicit anchor: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*(?:name|id)="([^"]+)"`)
	// inlineLink is a link inside a heading's text, kept as its text.
	inlineLink = regexp.MustCompile(`!?\[((?:\\.|[^\]\\])*)\]\([^)]*\)`)
)

// blank returns md with its fenced code blocks and inline code spans
// replaced by spaces, keeping every newline, so that offsets and line
// numbers still match the file and no code reads as a link.
func blank(md string) string {
	lines := strings.SplitAfter(md, "\n")
	var f fenced
	for i, ln := range lines {
		if f.code(ln) {
			lines[i] = spaces(ln)
		}
	}
	return blankCodeSpans(strings.Join(lines, ""))
}

// blankCodeSpans blanks s's inline code spans: a run of n backticks up to
// the next run of exactly n (which may be lines further on). A run with
// no closing one is literal backticks.
func blankCodeSpans(s string) string {
	b := []byte(s)
	run := func(i int) int { // the length of the backtick run at i
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		return n
	}
	for i := 0; i < len(b); {
		n := run(i)
		if n == 0 {
			i++
			continue
		}
		end := -1
		for j := i + n; j < len(b); {
			if m := run(j); m == n {
				end = j + m
				break
			} else if m > 0 {
				j += m
			} else {
				j++
			}
		}
		if end < 0 {
			i += n
			continue
		}
		copy(b[i:end], spaces(string(b[i:end])))
		i = end
	}
	return string(b)
}

// fenced follows a Markdown text's fenced code blocks, line by line.
type fenced struct {
	open string // the fence that opened the block we are in, "" outside
}

// code says whether ln, the next line, is code: a fence or a line
// between two.
func (f *fenced) code(ln string) bool {
	m := fence.FindStringSubmatch(ln)
	switch {
	case f.open == "" && m != nil:
		f.open = m[1]
		return true
	case f.open == "":
		return false
	case m != nil && m[1][0] == f.open[0] && len(m[1]) >= len(f.open) && strings.TrimSpace(ln) == m[1]:
		f.open = ""
	}
	return true
}

// spaces is s with every character but newlines turned into a space
// (byte for byte, so offsets stay).
func spaces(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c != '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

// Links returns the links of the Markdown text md, from file name, in
// order: inline links and images and reference definitions, outside code.
func Links(name, md string) []Link {
	text := blank(md)
	line := func(off int) int { return strings.Count(text[:off], "\n") + 1 }
	var links []Link
	for _, m := range inline.FindAllStringSubmatchIndex(text, -1) {
		links = append(links, Link{File: name, Line: line(m[0]), Target: text[m[4]:m[5]]})
	}
	for _, m := range refDef.FindAllStringSubmatchIndex(text, -1) {
		links = append(links, Link{File: name, Line: line(m[0]), Target: text[m[2]:m[3]]})
	}
	return links
}

// Anchors returns the anchors GitHub gives the headings of the Markdown
// text md (and its explicit <a name> or id anchors).
func Anchors(md string) map[string]bool {
	seen := map[string]int{}
	anchors := map[string]bool{}
	add := func(heading string) {
		slug := Slug(heading)
		n := seen[slug]
		seen[slug] = n + 1
		if n > 0 {
			slug += "-" + strconv.Itoa(n)
		}
		anchors[slug] = true
	}
	var f fenced
	prev := "" // the previous line, when it may be a setext heading's text
	for _, ln := range strings.Split(md, "\n") {
		if f.code(ln) {
			prev = ""
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(ln, -1) {
			anchors[m[1]] = true
		}
		if m := atx.FindStringSubmatch(ln); m != nil {
			add(m[2])
			prev = ""
			continue
		}
		if setext.MatchString(ln) && prev != "" {
			add(prev)
			prev = ""
			continue
		}
		prev = ""
		if t := strings.TrimSpace(ln); t != "" && !strings.HasPrefix(ln, "    ") &&
			!strings.HasPrefix(t, "|") && !strings.HasPrefix(t, "- ") && !strings.HasPrefix(t, "* ") {
			prev = t
		}
	}
	return anchors
}

// Slug is GitHub's anchor for a heading's Markdown text: the text as
// rendered (code spans' content, links' text, no emphasis marks), lower
// case, with every character that is not a letter, a digit, '_', '-' or a
// space dropped, and each space turned into '-'.
func Slug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Check returns the links of the Markdown files (paths relative to root)
// that do not resolve: a relative link must name a file or directory
// inside root, and an anchor a heading of the Markdown file it names (or
// of the file itself, for "#anchor").
func Check(root string, files []string) ([]Broken, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	anchorsOf := map[string]map[string]bool{} // by path relative to root
	anchors := func(rel string) (map[string]bool, error) {
		if a, ok := anchorsOf[rel]; ok {
			return a, nil
		}
		data, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		a := Anchors(string(data))
		anchorsOf[rel] = a
		return a, nil
	}
	var broken []Broken
	for _, file := range files {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		for _, l := range Links(file, string(data)) {
			if reason := resolve(root, l, anchors); reason != "" {
				broken = append(broken, Broken{Link: l, Reason: reason})
			}
		}
	}
	return broken, nil
}

// resolve says why l does not resolve, or "" when it does.
func resolve(root string, l Link, anchors func(string) (map[string]bool, error)) string {
	t := l.Target
	if t == "" {
		return "empty target"
	}
	if scheme.MatchString(t) || strings.HasPrefix(t, "//") {
		return "" // an absolute URL: not ours to check
	}
	path, frag, hasFrag := strings.Cut(t, "#")
	if strings.Contains(path, "?") {
		path, _, _ = strings.Cut(path, "?")
	}
	if strings.HasPrefix(path, "/") {
		return "absolute path: GitHub resolves it against the site, not the repository"
	}
	rel := filepath.Clean(filepath.Join(filepath.Dir(l.File), filepath.FromSlash(unescape(path))))
	if path == "" {
		rel = l.File
	}
	if rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "leads out of the repository"
	}
	st, err := os.Stat(filepath.Join(root, rel))
	if err != nil {
		return "no such file or directory: " + filepath.ToSlash(rel)
	}
	if !hasFrag {
		return ""
	}
	if frag == "" {
		return "empty anchor"
	}
	if st.IsDir() || !strings.EqualFold(filepath.Ext(rel), ".md") {
		return "an anchor on " + filepath.ToSlash(rel) + ", which is not a Markdown file"
	}
	a, err := anchors(rel)
	if err != nil {
		return err.Error()
	}
	if !a[unescape(frag)] {
		return "no heading of " + filepath.ToSlash(rel) + " has the anchor #" + frag
	}
	return ""
}

// unescape decodes a link's %XX escapes; a malformed one stays as
// written (and then names no file).
func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// layoutPath is a code span of a layout table's first column.
var layoutPath = regexp.MustCompile("`([^`]+)`")

// Table returns the cells of the body rows (not the header, not the
// delimiter row) of the first table under md's "## heading", trimmed.
func Table(md, heading string) [][]string {
	var rows [][]string
	in, header := false, false
	var f fenced
	for _, ln := range strings.Split(md, "\n") {
		if f.code(ln) {
			continue
		}
		if m := atx.FindStringSubmatch(ln); m != nil {
			if header {
				break
			}
			in = len(m[1]) == 2 && strings.TrimSpace(m[2]) == heading
			continue
		}
		t := strings.TrimSpace(ln)
		if !in || !strings.HasPrefix(t, "|") {
			if header { // the table has ended
				break
			}
			continue
		}
		if !header {
			header = true // the header row; the delimiter row comes next
			continue
		}
		cells := strings.Split(strings.Trim(t, "|"), "|")
		if strings.Trim(t, "|-: ") == "" {
			continue
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	return rows
}

// Layout returns the rows of the table under md's "## Layout" heading,
// keyed by each path its first column names in a code span (`image`,
// `image/unpack`, ...).
func Layout(md string) map[string]string {
	rows := map[string]string{}
	for _, cells := range Table(md, "Layout") {
		for _, m := range layoutPath.FindAllStringSubmatch(cells[0], -1) {
			rows[m[1]] = strings.Join(cells, " | ")
		}
	}
	return rows
}

// Covered says whether a layout table (from Layout) names dir: in a row of
// its own, or as `base/` in its parent's row.
func Covered(rows map[string]string, dir string) bool {
	if _, ok := rows[dir]; ok {
		return true
	}
	parent, base := path.Split(dir)
	row, ok := rows[strings.TrimSuffix(parent, "/")]
	return ok && strings.Contains(row, "`"+base+"/`")
}

// GoPackages returns the directories under root (relative, with '/')
// that hold .go files, but for testdata, node_modules and hidden ones.
func GoPackages(root string) ([]string, error) {
	seen := map[string]bool{}
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == "testdata" || n == "node_modules" || strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		if rel = filepath.ToSlash(rel); !seen[rel] {
			seen[rel] = true
			dirs = append(dirs, rel)
		}
		return nil
	})
	return dirs, err
}
