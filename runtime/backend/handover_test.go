package backend

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// program plays the program's end of h: it writes say, answers "go" with
// "ok", and returns what it read until agentrun's end closed.
func program(t *testing.T, h *Handover, say string) <-chan string {
	t.Helper()
	child, argv := h.Child(7, []string{"/dev/init", "--", "python3", FDArg, "x"})
	if strings.Join(argv, " ") != "/dev/init -- python3 7 x" {
		t.Fatalf("argv %q", argv)
	}
	// The program's, as the backend's exec gives it: no longer h's.
	f := child
	h.child = nil
	got := make(chan string, 1)
	go func() {
		defer f.Close()
		if say != "" {
			f.Write([]byte(say))
		}
		b := make([]byte, 100)
		var all []byte
		for {
			n, err := f.Read(b)
			all = append(all, b[:n]...)
			if string(all) == "go\n" && n > 0 {
				f.Write([]byte("ok\n"))
			}
			if err != nil {
				got <- string(all)
				return
			}
		}
	}()
	return got
}

// TestHandover: ready, then go, ok and agentrun's close; the program
// reads "go" and then the end of the channel.
func TestHandover(t *testing.T) {
	h, err := NewHandover("warm program")
	if err != nil {
		t.Fatal(err)
	}
	read := program(t, h, "ready\n")
	if err := h.Ready(context.Background(), 5*time.Second); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	if err := h.Go(context.Background(), 5*time.Second); err != nil {
		t.Fatalf("Go: %v", err)
	}
	select {
	case got := <-read:
		if got != "go\n" {
			t.Fatalf("the program read %q; want go and the close", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the program never saw agentrun's end close")
	}
}

// TestHandoverRefusesWhatIsNotReady: a failure, junk, a long line, a
// close or silence is an error naming it, never ready.
func TestHandoverRefusesWhatIsNotReady(t *testing.T) {
	for _, tc := range []struct{ say, want string }{
		{"fail preload numpy: ModuleNotFoundError: no\n", "warm program: preload numpy: ModuleNotFoundError: no"},
		{"READY\n", `said "READY"`},
		{"ready\x1b[2J\n", `said "ready\\x1b[2J"`},
		{"rea", `closed its end (or ended) after "rea"`},
		{"", "closed its end"},
		{strings.Repeat("r", 2000), "longer than 1024 bytes"},
	} {
		h, err := NewHandover("warm program")
		if err != nil {
			t.Fatal(err)
		}
		child, _ := h.Child(3, nil)
		f := child
		h.child = nil // the test's, not the backend's, to close
		if tc.say != "" {
			f.Write([]byte(tc.say))
		}
		if !strings.HasSuffix(tc.say, "\n") && len(tc.say) < 1024 {
			f.Close()
		}
		err = h.Ready(context.Background(), 5*time.Second)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Ready after %q = %v; want an error with %q", tc.say, err, tc.want)
		}
		f.Close()
		h.Close()
	}
	h, err := NewHandover("warm program")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Ready(context.Background(), 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("Ready with a silent program = %v; want no answer", err)
	}
	// A set-up stopped (the pool closed) stops the wait, with ctx's error.
	stopped, stop := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, stop)
	began := time.Now()
	if err := h.Ready(stopped, time.Minute); !errors.Is(err, context.Canceled) || time.Since(began) > 30*time.Second {
		t.Errorf("Ready with its context cancelled = %v after %v; want context.Canceled at once", err, time.Since(began))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.Go(ctx, 5*time.Second); err == nil {
		t.Error("Go with a cancelled context and no answer = nil")
	}
}

// TestHandoverLateOK: a Go that timed out leaves agentrun's end open, so
// that an "ok" past the wait never meets the close the program waits for
// before it runs the task; the program reads its end-of-file only once
// the caller (having killed the sandbox) closes the channel.
func TestHandoverLateOK(t *testing.T) {
	h, err := NewHandover("warm program")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	child, _ := h.Child(3, nil)
	f := child
	h.child = nil // the program's
	defer f.Close()
	if err := h.Go(context.Background(), 10*time.Millisecond); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Fatalf("Go with a silent program = %v; want no answer", err)
	}
	// The program's late "ok", then its wait for agentrun's close, polled
	// once: data or would-block, never the end.
	if _, err := f.Write([]byte("ok\n")); err != nil {
		t.Fatalf("the program's late ok: %v", err)
	}
	fd := int(f.Fd())
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	n, err := unix.Read(fd, b)
	if string(b[:max(n, 0)]) != "go\n" {
		t.Fatalf("the program read %q, %v; want go", b[:max(n, 0)], err)
	}
	n, err = unix.Read(fd, b)
	if n == 0 && err == nil {
		t.Fatal("after a failed Go the program read the end of the channel: its task's code would run")
	}
	if !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("the program's read after a failed Go = %d, %v; want would-block", n, err)
	}
	// Closed with the late "ok" unread: the end, or its reset.
	h.Close()
	if n, err := unix.Read(fd, b); (err == nil && n != 0) || (err != nil && !errors.Is(err, unix.ECONNRESET)) {
		t.Fatalf("the program's read after Close = %d, %v; want the end", n, err)
	}
}
