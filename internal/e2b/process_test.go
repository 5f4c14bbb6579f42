package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentrun/agentrun/internal/e2b/envd/process"
	"github.com/agentrun/agentrun/internal/e2b/envd/process/processconnect"
	"github.com/agentrun/agentrun/internal/runapi"
)

// fakeProc runs until the test ends: no event ever comes.
type fakeProc struct{ runapi.Process }

func (fakeProc) Pid() int { return 7 }
func (fakeProc) Next(ctx context.Context, seq int) ([]runapi.ProcessEvent, int, bool) {
	<-ctx.Done()
	return nil, seq, false
}
func (fakeProc) Signal(syscall.Signal) error { return nil }

// stdinOf records what the fake processes were written, in order.
var stdinOf struct {
	sync.Mutex
	data   []string
	closed bool
}

func (fakeProc) WriteStdin(data []byte, close bool) error {
	stdinOf.Lock()
	defer stdinOf.Unlock()
	stdinOf.data = append(stdinOf.data, string(data))
	stdinOf.closed = stdinOf.closed || close
	return nil
}

func (sb *fakeSandbox) Process(pid int) runapi.Process {
	if pid == 7 {
		return fakeProc{}
	}
	return nil
}

// TestStreamsBounded: a sandbox takes at most maxStreams streams into
// it at once; the one past them is refused (resource exhausted) and
// others are taken again once some close; a process that is none is
// NotFound.
func TestStreamsBounded(t *testing.T) {
	_, _, ts, _ := door(t)
	_, body := call(t, ts, "POST", "/sandboxes", `{}`, map[string]string{"X-API-Key": "e2b_alice"})
	var sb sandboxJSON
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	client := processconnect.NewProcessClient(http.DefaultClient, ts.URL, connect.WithProtoJSON())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(ctx context.Context, pid uint32) (*connect.ServerStreamForClient[process.ConnectResponse], error) {
		req := connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}})
		req.Header().Set(SandboxIDHeader, sb.SandboxID)
		req.Header().Set(SandboxPortHeader, "49983")
		req.Header().Set(AccessTokenHeader, sb.EnvdAccessToken)
		st, err := client.Connect(ctx, req)
		if err != nil {
			return nil, err
		}
		if !st.Receive() { // the start event
			return nil, st.Err()
		}
		return st, nil
	}
	if _, err := open(ctx, 8); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a process that is none: %v, want not found", err)
	}
	var first context.CancelFunc
	for i := 0; i < maxStreams; i++ {
		sctx, scancel := context.WithCancel(ctx)
		t.Cleanup(scancel)
		if i == 0 {
			first = scancel
		}
		if _, err := open(sctx, 7); err != nil {
			t.Fatalf("stream %d: %v", i+1, err)
		}
	}
	if _, err := open(ctx, 7); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("stream %d: %v, want resource exhausted", maxStreams+1, err)
	}
	first()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := open(ctx, 7)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after one closed, a stream is still refused: %v", err)
		}
	}
}

// TestStreamInput: a client stream of input names its process first,
// then its data go to that process's stdin in order; data before a start
// is refused; closeStdin closes it.
func TestStreamInput(t *testing.T) {
	_, _, ts, _ := door(t)
	_, body := call(t, ts, "POST", "/sandboxes", `{}`, map[string]string{"X-API-Key": "e2b_alice"})
	var sb sandboxJSON
	if err := json.Unmarshal([]byte(body), &sb); err != nil {
		t.Fatal(err)
	}
	client := processconnect.NewProcessClient(http.DefaultClient, ts.URL, connect.WithProtoJSON())
	headers := func(h http.Header) {
		h.Set(SandboxIDHeader, sb.SandboxID)
		h.Set(SandboxPortHeader, "49983")
		h.Set(AccessTokenHeader, sb.EnvdAccessToken)
	}
	data := func(s string) *process.StreamInputRequest {
		return &process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(s)}}}}}
	}
	st := client.StreamInput(context.Background())
	headers(st.RequestHeader())
	_ = st.Send(data("early"))
	if _, err := st.CloseAndReceive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("input before a start: %v, want invalid argument", err)
	}
	st = client.StreamInput(context.Background())
	headers(st.RequestHeader())
	start := &process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 7}}}}}
	for _, m := range []*process.StreamInputRequest{start, data("a"), data("b"), data("c")} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	req := connect.NewRequest(&process.CloseStdinRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 7}}})
	headers(req.Header())
	if _, err := client.CloseStdin(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	stdinOf.Lock()
	defer stdinOf.Unlock()
	if got := strings.Join(stdinOf.data, ""); got != "abc" || !stdinOf.closed {
		t.Errorf("the process's stdin got %q, closed %v; want abc, closed", got, stdinOf.closed)
	}
}
