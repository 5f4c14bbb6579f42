package docs

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/config"
)

// TestLinks checks every relative link of README.md, docs/*.md and the
// Python client's README (which points at its pages here).
func TestLinks(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository root is not at %s: %v", root, err)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", "clients/python/README.md"}
	for _, p := range pages {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	if len(files) < 2 {
		t.Fatalf("no docs/*.md under %s", root)
	}
	broken, err := Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range broken {
		t.Error(b)
	}
	t.Logf("%d files checked", len(files))
}

// TestCheckFindsBroken gives Check a small tree with a link of each kind,
// good and broken, and wants exactly the broken ones.
func TestCheckFindsBroken(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("examples/a.json", "{}")
	write("docs/page.md", `# Page

## Same
## Same
## The `+"`run_code`"+` tool: a/b, c
Setext heading
--------------

<a name="explicit"></a>

`+"```sh"+`
## not a heading: a comment in a fence
`+"```"+`

Back to the [README](../README.md#top) and [itself](#same-1),
[gone](#same-2), [out](../../etc/passwd), [dir](../examples/),
[fenced](#not-a-heading-a-comment-in-a-fence).
`)
	write("README.md", `# Top

[ok](docs/page.md) [ok](docs/page.md#same) [ok](docs/page.md#the-run_code-tool-ab-c)
[ok](docs/page.md#setext-heading) [ok](docs/page.md#explicit) [ok](examples/a.json)
[ok](https://example.com/nowhere) ![ok](examples/a.json "title") [ok](#top)
[ok, wrapped
over lines](docs/page.md) [ok](docs/page%2Emd)

[missing file](docs/gone.md)
[missing anchor](docs/page.md#nowhere)
[anchor on a non-Markdown file](examples/a.json#x)
[absolute](/docs/page.md)
[wrapped and
missing](docs/other.md#x)
[ref]: docs/missing-ref.md

`+"`[in a code span](docs/gone.md)`"+` and `+"``[in ``"+`](docs/gone.md)`+"``"+`
`+"```"+`
[in a fence](docs/gone.md)
`+"```"+`
`)
	broken, err := Check(root, []string{"README.md", "docs/page.md"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range broken {
		got = append(got, b.File+":"+b.Target)
	}
	want := []string{
		"README.md:docs/gone.md",
		"README.md:docs/page.md#nowhere",
		"README.md:examples/a.json#x",
		"README.md:/docs/page.md",
		"README.md:docs/other.md#x",
		"README.md:docs/missing-ref.md",
		"docs/page.md:#same-2",
		"docs/page.md:../../etc/passwd",
		"docs/page.md:#not-a-heading-a-comment-in-a-fence",
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("broken links:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, b := range broken {
		if b.File == "README.md" && b.Target == "docs/other.md#x" && b.Line != 13 {
			t.Errorf("%s: line %d, want 13 (where the link starts)", b, b.Line)
		}
	}
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Services: credentials that never enter, method/path rules, approval", "services-credentials-that-never-enter-methodpath-rules-approval"},
		{"agentrun run --server", "agentrun-run---server"},
		{"Workers' tests", "workers-tests"},
		{"`run_code`", "run_code"},
		{"task.json", "taskjson"},
		{"/tmp and the memory limit", "tmp-and-the-memory-limit"},
		{"See [the page](x.md) now", "see-the-page-now"},
		{"Über Ärger 2", "über-ärger-2"},
	} {
		if got := Slug(c.heading); got != c.want {
			t.Errorf("Slug(%q) = %q; want %q", c.heading, got, c.want)
		}
	}
}

// TestLayout checks docs/architecture.md's layout table against the tree:
// every directory of Go files is named, and every path named exists.
func TestLayout(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := Layout(string(data))
	if len(rows) == 0 {
		t.Fatal("docs/architecture.md has no ## Layout table")
	}
	for p := range rows {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
			t.Errorf("docs/architecture.md's layout names %s, which is not in the tree", p)
		}
	}
	dirs, err := GoPackages(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if d != "." && !Covered(rows, d) {
			t.Errorf("docs/architecture.md's layout does not name %s (a row of its own, or `%s/` in its parent's row)", d, path.Base(d))
		}
	}
}

func TestCovered(t *testing.T) {
	rows := Layout("# X\n\n## Layout\n\n| path | job |\n|---|---|\n| `image`, `image/unpack` | store |\n| `test/escape` | battery (`probe/`: in the sandbox) |\n\n## Next\n\n| `other` | not the layout |\n")
	for dir, want := range map[string]bool{
		"image": true, "image/unpack": true, "test/escape": true, "test/escape/probe": true,
		"test/escape/other": false, "image/imagetest": false, "other": false, "test": false,
	} {
		if got := Covered(rows, dir); got != want {
			t.Errorf("Covered(%q) = %v; want %v", dir, got, want)
		}
	}
}

// TestLimitsTable checks docs/config.md's table of limits against
// config.LimitTable and the built-in defaults and maxima.
func TestLimitsTable(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	var want [][]string
	def := config.Default()
	for _, l := range config.LimitTable {
		want = append(want, []string{"`" + l.Name + "`", "`" + l.Text(def.Limits) + "`", "`" + l.Text(def.Policy.Limits) + "`", size(l.Min), l.Reaches})
	}
	checkTable(t, "docs/config.md", Table(string(data), "Limits"), "Limits", want, "config.LimitTable")
}

// checkTable compares the rows of page's table under ## heading with
// want, which source makes.
func checkTable(t *testing.T, page string, rows [][]string, heading string, want [][]string, source string) {
	t.Helper()
	if len(rows) != len(want) {
		t.Errorf("%s's ## %s table has %d rows; %s has %d", page, heading, len(rows), source, len(want))
	}
	for i := range min(len(rows), len(want)) {
		if !slices.Equal(rows[i], want[i]) {
			t.Errorf("%s's ## %s table, row %d: %q; want %q (%s)", page, heading, i+1, rows[i], want[i], source)
		}
	}
}

// TestReloadTable checks docs/serve.md's table of what a reload applies
// against config.ReloadTable, row for row.
func TestReloadTable(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "serve.md"))
	if err != nil {
		t.Fatal(err)
	}
	var want [][]string
	for _, k := range config.ReloadTable {
		on := "applied"
		if k.Restart {
			on = "restart only"
		}
		want = append(want, []string{"`" + k.Key + "`", on, k.Effect})
	}
	checkTable(t, "docs/serve.md", Table(string(data), "Reload"), "Reload", want, "config.ReloadTable")
}

// TestRestartOnlyList checks docs/config.md's list of the keys only a
// restart applies against config.ReloadTable's.
func TestRestartOnlyList(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "config.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(data), "Restart only: ")
	list, _, _ = strings.Cut(list, ".\n")
	if !ok {
		t.Fatal(`docs/config.md has no "Restart only: " list`)
	}
	var got, want []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(list, -1) {
		got = append(got, m[1])
	}
	for _, k := range config.ReloadTable {
		if k.Restart {
			want = append(want, k.Key)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/config.md's restart-only keys %q; want %q (config.ReloadTable)", got, want)
	}
}

// size writes a limit's minimum as the docs do: "" for none, else `8m`
// or `64k`.
func size(n int64) string {
	switch {
	case n == 0:
		return ""
	case n%(1<<20) == 0:
		return fmt.Sprintf("`%dm`", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("`%dk`", n>>10)
	}
	return fmt.Sprintf("`%d`", n)
}
