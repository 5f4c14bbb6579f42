package session

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestCreatedStays: a session's creation time is the time it was made,
// not its disk's change time: a write into its disk does not move it, and
// a fork's copy has its own.
func TestCreatedStays(t *testing.T) {
	s := testStore(t)
	before := time.Now()
	id, err := s.Create()
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	in, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if in.Created.Before(before) || in.Created.After(after) {
		t.Errorf("created %v; want between %v and %v", in.Created, before, after)
	}
	if err := s.WriteFile(id, "a.txt", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	again, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Created.Equal(in.Created) {
		t.Errorf("created moved with a write: %v, then %v", in.Created, again.Created)
	}
	forked, err := s.Fork(context.Background(), id, 1)
	if err != nil {
		t.Fatal(err)
	}
	copyInfo, err := s.Get(forked.IDs[0])
	if err != nil {
		t.Fatal(err)
	}
	if !copyInfo.Created.After(in.Created) {
		t.Errorf("the fork's created %v; want its own, after the source's %v", copyInfo.Created, in.Created)
	}
}
