package e2b

import (
	"context"
	"encoding/json"
	"net/http"
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
