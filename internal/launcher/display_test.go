package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agentrun/agentrun/internal/result"
)

// TestDisplayReaderIncremental: a channel read as the program writes it,
// cut anywhere, keeps and emits exactly what one read at its end keeps,
// within the same bounds (budget in the channel's order, MaxDisplay, a
// later value replacing an earlier one).
func TestDisplayReaderIncremental(t *testing.T) {
	var lines []string
	lines = append(lines, `{"display": {"text/plain": "`+strings.Repeat("x", 300)+`"}}`, "not json", `{"value": {"text/plain": "1"}}`)
	for i := range MaxDisplay + 2 {
		lines = append(lines, fmt.Sprintf(`{"display": {"text/plain": "%d"}}`, i))
	}
	lines = append(lines, `{"display": {"text/plain": "`+strings.Repeat("y", 400)+`"}}`, `{"value": {"text/plain": "22"}}`, `{"display": {"text/plain": "cut`)
	channel := strings.Join(lines, "\n")
	const budget = 500

	once := t.TempDir()
	if err := os.WriteFile(filepath.Join(once, displayFile), []byte(channel), 0o600); err != nil {
		t.Fatal(err)
	}
	var want result.Result
	NewDisplayReader(openDir(t, once), budget, nil).Finish(&want)

	for _, step := range []int{1, 7, 64, len(channel)} {
		dir := t.TempDir()
		f, err := os.Create(filepath.Join(dir, displayFile))
		if err != nil {
			t.Fatal(err)
		}
		var emitted []map[string]string
		d := NewDisplayReader(openDir(t, dir), budget, func(b map[string]string) { emitted = append(emitted, b) })
		for i := 0; i < len(channel); i += step {
			if _, err := f.WriteString(channel[i:min(i+step, len(channel))]); err != nil {
				t.Fatal(err)
			}
			d.poll()
		}
		f.Close()
		var got result.Result
		d.Finish(&got)
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(emitted, want.Display) {
			t.Errorf("step %d: got %+v, emitted %q; want %+v", step, got, emitted, want)
		}
	}
	if want.Value["text/plain"] != "22" || len(want.Display) != MaxDisplay || want.Display[0]["text/plain"] != strings.Repeat("x", 300) {
		t.Errorf("one read: %+v", want)
	}
	// Dropped: "not json", the replaced value, the three past
	// MaxDisplay, the y's past the budget, the cut line.
	if want.DisplayDropped != 7 {
		t.Errorf("dropped %d; want 7", want.DisplayDropped)
	}
}
