package session

import (
	"context"
	"io"
	"testing"
)

// TestKeptState: a session has no state until one is committed; an
// aborted one leaves the previous; a fork copies it; a reset removes it.
func TestKeptState(t *testing.T) {
	s := testStore(t)
	id, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	read := func(id string) string {
		t.Helper()
		l, err := s.Lock(id)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		f, err := l.State()
		if err != nil {
			t.Fatal(err)
		}
		if f == nil {
			return "<none>"
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write := func(data string, commit bool) {
		t.Helper()
		l, err := s.Lock(id)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release()
		w, err := l.NewState()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Abort()
		if _, err := w.Write([]byte(data)); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := w.Commit(); err != nil {
				t.Fatal(err)
			}
			if err := l.SyncState(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := read(id); got != "<none>" {
		t.Errorf("a new session's state: %q", got)
	}
	write("one", true)
	write("two", false)
	if got := read(id); got != "one" {
		t.Errorf("after an aborted state: %q; want the committed one", got)
	}
	forked, err := s.Fork(context.Background(), id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(forked.IDs[0]); got != "one" {
		t.Errorf("the fork's state: %q", got)
	}
	l, err := s.Lock(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.ResetState(); err != nil {
		t.Fatal(err)
	}
	l.Release()
	if got := read(id); got != "<none>" {
		t.Errorf("after a reset: %q", got)
	}
}
