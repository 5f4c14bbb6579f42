package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem"
	"github.com/agentrun/agentrun/internal/runapi"
)

// Bounds of watching a sandbox's directories.
const (
	// MaxWatchers bounds the watchers of one sandbox, streams (WatchDir)
	// and polled ones (CreateWatcher) together.
	MaxWatchers = 16
	// MaxWatchEvents bounds the events a watcher keeps until they are
	// taken; past it the oldest go.
	MaxWatchEvents = 1024
	// watchDepth is how deep a recursive watcher looks.
	watchDepth = 16
)

// pollEvery is how often a watcher lists its directory. A variable for
// the tests.
var pollEvery = 200 * time.Millisecond

// A watcher polls its directory with the sandbox's link-safe List (no
// inotify, whose watches take a host path): each poll compares what it
// lists (type, size, mode, mtime of every entry, depth levels down) with
// the last, and a change is an event: a new name CREATE, a gone one
// REMOVE, another size or mtime WRITE, another mode CHMOD. A rename is a
// REMOVE and a CREATE; a change within one poll that leaves the entry as
// it was is not seen.
type watcher struct {
	sb    runapi.Sandbox
	dir   string // the sandbox path watched
	depth int

	mu      sync.Mutex
	events  []*filesystem.FilesystemEvent
	dropped int
	notify  chan struct{} // a send when an event comes
	stop    chan struct{}
	done    chan struct{}
	err     error // why it stopped, once done
}

type entryState struct {
	typ, mode string
	size      int64
	mtime     time.Time
}

// snapshot lists w's directory as a watcher compares it. It runs on
// the watcher's own goroutine, where no HTTP server recovers a panic: a
// list that panics (the sandbox torn down under it) is an error.
func (w *watcher) snapshot() (_ map[string]entryState, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("listing %s: %v", w.dir, p)
		}
	}()
	files, err := w.sb.ListDepth(w.dir, w.depth)
	if err != nil {
		return nil, err
	}
	out := make(map[string]entryState, len(files))
	for _, f := range files {
		rel := strings.TrimPrefix(strings.TrimPrefix(f.Path, w.dir), "/")
		out[rel] = entryState{typ: f.Type, mode: f.Mode, size: f.Size, mtime: f.MTime}
	}
	return out, nil
}

// newWatcher starts watching dir of sb (depth levels down).
func newWatcher(sb runapi.Sandbox, dir string, recursive bool) (*watcher, error) {
	w := &watcher{sb: sb, dir: path.Clean(dir), depth: 1, notify: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	if recursive {
		w.depth = watchDepth
	}
	last, err := w.snapshot()
	if err != nil {
		return nil, err
	}
	go w.run(last)
	return w, nil
}

func (w *watcher) run(last map[string]entryState) {
	defer close(w.done)
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		now, err := w.snapshot()
		if err != nil {
			// The directory is gone, or the sandbox ended.
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			w.wake()
			return
		}
		w.diff(last, now)
		last = now
	}
}

// diff adds the events between two snapshots, in name order per kind.
func (w *watcher) diff(last, now map[string]entryState) {
	var evs []*filesystem.FilesystemEvent
	add := func(name string, t filesystem.EventType) {
		evs = append(evs, &filesystem.FilesystemEvent{Name: name, Type: t})
	}
	for _, name := range slices.Sorted(maps.Keys(last)) {
		if _, ok := now[name]; !ok {
			add(name, filesystem.EventType_EVENT_TYPE_REMOVE)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(now)) {
		n := now[name]
		l, ok := last[name]
		switch {
		case !ok || l.typ != n.typ:
			add(name, filesystem.EventType_EVENT_TYPE_CREATE)
		case l.size != n.size || !l.mtime.Equal(n.mtime):
			add(name, filesystem.EventType_EVENT_TYPE_WRITE)
		case l.mode != n.mode:
			add(name, filesystem.EventType_EVENT_TYPE_CHMOD)
		}
	}
	if len(evs) == 0 {
		return
	}
	w.mu.Lock()
	w.events = append(w.events, evs...)
	if over := len(w.events) - MaxWatchEvents; over > 0 {
		w.dropped += over
		w.events = append(w.events[:0], w.events[over:]...)
	}
	w.mu.Unlock()
	w.wake()
}

func (w *watcher) wake() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// take returns the events kept and forgets them, and why the watcher
// stopped, if it did.
func (w *watcher) take() ([]*filesystem.FilesystemEvent, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.events
	w.events = nil
	return evs, w.err
}

// Close stops the watcher.
func (w *watcher) Close() error {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	return nil
}

// watchers are one sandbox's, kept for its life (Call.Keep): closed with
// it.
type watchers struct {
	mu     sync.Mutex
	byID   map[string]*watcher
	n      int // streams and polled ones
	closed bool
}

type watchersKey struct{}

func watchersOf(c *Call) *watchers {
	v := c.Keep(watchersKey{}, func() any { return &watchers{byID: map[string]*watcher{}} })
	ws, _ := v.(*watchers)
	return ws
}

// start makes a watcher of dir for the sandbox, within MaxWatchers.
func (ws *watchers) start(sb runapi.Sandbox, name string, recursive bool) (*watcher, error) {
	if ws == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox has ended"))
	}
	ws.mu.Lock()
	if ws.closed || ws.n >= MaxWatchers {
		ws.mu.Unlock()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("a sandbox has at most %d watchers at once: remove one first", MaxWatchers))
	}
	ws.n++
	ws.mu.Unlock()
	dir := sandboxPath(name)
	fi, err := sb.Stat(dir)
	if err == nil && fi.Type != "dir" {
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%q is not a directory", name))
	}
	var w *watcher
	if err == nil {
		w, err = newWatcher(sb, dir, recursive)
	}
	if err != nil {
		ws.release()
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		return nil, fsError(name, err)
	}
	return w, nil
}

func (ws *watchers) release() {
	ws.mu.Lock()
	ws.n--
	ws.mu.Unlock()
}

// Close stops every polled watcher; streams end with their requests.
func (ws *watchers) Close() error {
	ws.mu.Lock()
	ws.closed = true
	all := ws.byID
	ws.byID = map[string]*watcher{}
	ws.mu.Unlock()
	for _, w := range all {
		w.Close()
	}
	return nil
}

func (fsService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	c := CallOf(ctx)
	if c == nil {
		return connect.NewError(connect.CodeInternal, errors.New("not a call into a sandbox"))
	}
	ws := watchersOf(c)
	w, err := ws.start(c.Sandbox, req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	defer ws.release()
	defer w.Close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	keep := time.NewTicker(keepaliveEvery(req.Header()))
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keep.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-w.notify:
		}
		evs, werr := w.take()
		for _, ev := range evs {
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		if werr != nil {
			return fsError(req.Msg.GetPath(), werr)
		}
	}
}

func (fsService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	c := CallOf(ctx)
	if c == nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("not a call into a sandbox"))
	}
	ws := watchersOf(c)
	w, err := ws.start(c.Sandbox, req.Msg.GetPath(), req.Msg.GetRecursive())
	if err != nil {
		return nil, err
	}
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	ws.mu.Lock()
	if ws.closed {
		ws.mu.Unlock()
		w.Close()
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox has ended"))
	}
	ws.byID[id] = w
	ws.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// polled is the polled watcher id of ctx's sandbox.
func polled(ctx context.Context, id string) (*watchers, *watcher, error) {
	c := CallOf(ctx)
	if c == nil {
		return nil, nil, connect.NewError(connect.CodeInternal, errors.New("not a call into a sandbox"))
	}
	ws := watchersOf(c)
	if ws == nil {
		return nil, nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox has ended"))
	}
	ws.mu.Lock()
	w := ws.byID[id]
	ws.mu.Unlock()
	if w == nil {
		return nil, nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no watcher %q", id))
	}
	return ws, w, nil
}

func (fsService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	_, w, err := polled(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	evs, werr := w.take()
	if len(evs) == 0 && werr != nil {
		return nil, fsError(w.dir, werr)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (fsService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	ws, w, err := polled(ctx, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	ws.mu.Lock()
	_, mine := ws.byID[req.Msg.GetWatcherId()]
	delete(ws.byID, req.Msg.GetWatcherId())
	ws.mu.Unlock()
	if mine {
		w.Close()
		ws.release()
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
