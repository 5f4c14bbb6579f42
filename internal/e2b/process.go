package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/agentrun/agentrun/internal/e2b/envd/process"
	"github.com/agentrun/agentrun/internal/e2b/envd/process/processconnect"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// envd's process service (process.Process over Connect, JSON and
// binary), answered on the host: each process is an exec into the live
// sandbox (runapi.Sandbox's Exec), as the sandbox's uid whatever E2B user
// the call names.

// Bounds of the process service.
const (
	// maxProcessMessage bounds one message a client sends (a start, a
	// piece of input): a stdin write is bounded by it.
	maxProcessMessage = 1 << 20
	// maxTags bounds the tags a sandbox's processes hold.
	maxTags = 1024
	// maxStreams bounds the streams open at once into one sandbox
	// (starts and connects following output, input streams).
	maxStreams = 64
	// keepalive bounds, by the client's Keepalive-Ping-Interval.
	minKeepalive, maxKeepalive, defKeepalive = time.Second, 5 * time.Minute, 50 * time.Second
)

func (h *Handler) routeProcess(mux *http.ServeMux) {
	path, handler := processconnect.NewProcessHandler(processService{},
		connect.WithReadMaxBytes(maxProcessMessage), connect.WithSendMaxBytes(maxProcessMessage+64<<10))
	mux.Handle(path, handler)
}

// processService implements processconnect.ProcessHandler over the
// call's sandbox.
type processService struct{}

// callOf is ctx's call, checked by the door.
func callOf(ctx context.Context) (*Call, error) {
	c := CallOf(ctx)
	if c == nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("a call into no sandbox"))
	}
	return c, nil
}

// tags maps a sandbox's process tags to their pids.
type tags struct {
	mu  sync.Mutex
	pid map[string]int
}

type tagsKey struct{}

// streams counts a sandbox's open streams.
type streams struct {
	mu sync.Mutex
	n  int
}

type streamsKey struct{}

// openStream counts one more stream into c's sandbox, or refuses it past
// maxStreams; done uncounts it.
func openStream(c *Call) (done func(), err error) {
	s, _ := c.Keep(streamsKey{}, func() any { return &streams{} }).(*streams)
	if s == nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox has ended"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n >= maxStreams {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d streams open into the sandbox at once", maxStreams))
	}
	s.n++
	return func() {
		s.mu.Lock()
		s.n--
		s.mu.Unlock()
	}, nil
}

func tagsOf(c *Call) *tags {
	t, _ := c.Keep(tagsKey{}, func() any { return &tags{pid: map[string]int{}} }).(*tags)
	if t == nil {
		return &tags{pid: map[string]int{}} // the sandbox ended
	}
	return t
}

// add tags pid, forgetting the tags of processes the sandbox no longer
// knows; false past maxTags.
func (t *tags) add(sb runapi.Sandbox, tag string, pid int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pid) >= maxTags {
		for k, p := range t.pid {
			if sb.Process(p) == nil {
				delete(t.pid, k)
			}
		}
	}
	if len(t.pid) >= maxTags {
		return false
	}
	t.pid[tag] = pid
	return true
}

func (t *tags) tagOf(pid int) *string {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, p := range t.pid {
		if p == pid {
			return &k
		}
	}
	return nil
}

// selectedOf is selected, of the call ctx carries.
func selectedOf(ctx context.Context, sel *process.ProcessSelector) (runapi.Process, error) {
	c, err := callOf(ctx)
	if err != nil {
		return nil, err
	}
	return selected(c, sel)
}

// selected is the process sel names, or CodeNotFound.
func selected(c *Call, sel *process.ProcessSelector) (runapi.Process, error) {
	pid := -1
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		pid = int(s.Pid)
	case *process.ProcessSelector_Tag:
		t := tagsOf(c)
		t.mu.Lock()
		p, ok := t.pid[s.Tag]
		t.mu.Unlock()
		if !ok {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", s.Tag))
		}
		pid = p
	}
	p := c.Sandbox.Process(pid)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
	}
	return p, nil
}

// rpcError is err as a Connect error, by its kind.
func rpcError(err error) error {
	code := connect.CodeInternal
	switch errkind.Of(err) {
	case errkind.Invalid, errkind.Policy:
		code = connect.CodeInvalidArgument
	case errkind.NotFound:
		code = connect.CodeNotFound
	case errkind.Busy:
		code = connect.CodeFailedPrecondition
	case errkind.Quota, errkind.TooLarge, errkind.Full:
		code = connect.CodeResourceExhausted
	case errkind.Timeout:
		code = connect.CodeDeadlineExceeded
	case errkind.Unavailable:
		code = connect.CodeUnavailable
	}
	return connect.NewError(code, err)
}

func (processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	c, err := callOf(ctx)
	if err != nil {
		return err
	}
	done, err := openStream(c)
	if err != nil {
		return err
	}
	defer done()
	m := req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	ex := runapi.ExecRequest{Command: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(),
		Stdin: m.Stdin == nil || m.GetStdin()} // absent: E2B's older SDKs' always-open stdin
	if m.Pty != nil {
		size := m.GetPty().GetSize()
		ex.TTY = &runapi.TTYSize{Rows: int(size.GetRows()), Cols: int(size.GetCols())}
	}
	// The call's timeout is the process's, as envd has it: the SDK's
	// timeoutMs (60 s unless set; 0 for none) kills the process, not
	// only the stream; a stream that ends sooner leaves it running.
	if ms, err := strconv.ParseInt(req.Header().Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		ex.Timeout = time.Duration(min(ms, int64(24*time.Hour/time.Millisecond))) * time.Millisecond
	}
	p, err := c.Sandbox.Exec(ex)
	if err != nil {
		return rpcError(err)
	}
	if m.Tag != nil && !tagsOf(c).add(c.Sandbox, m.GetTag(), p.Pid()) {
		_ = p.Signal(syscall.SIGKILL)
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d tagged processes", maxTags))
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(startEvent(p)); err != nil {
		return err
	}
	return follow(ctx, req.Header(), p, 0, send)
}

func (processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	c, err := callOf(ctx)
	if err != nil {
		return err
	}
	p, err := selected(c, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	done, err := openStream(c)
	if err != nil {
		return err
	}
	defer done()
	// What it printed before is not sent again (as envd's Connect).
	past, cancel := context.WithCancel(ctx)
	cancel()
	_, seq, ended := p.Next(past, 0)
	if ended {
		seq-- // its exit is the last event: sent below
	}
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p)); err != nil {
		return err
	}
	return follow(ctx, req.Header(), p, seq, send)
}

func startEvent(p runapi.Process) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(p.Pid())}}}
}

// follow sends p's events from seq on until its end, and a keepalive
// when none came for the client's Keepalive-Ping-Interval.
func follow(ctx context.Context, hdr http.Header, p runapi.Process, seq int, send func(*process.ProcessEvent) error) error {
	every := defKeepalive
	if n, err := strconv.Atoi(hdr.Get("Keepalive-Ping-Interval")); err == nil {
		every = min(max(time.Duration(n)*time.Second, minKeepalive), maxKeepalive)
	}
	for {
		wait, cancel := context.WithTimeout(ctx, every)
		evs, next, ended := p.Next(wait, seq)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		seq = next
		if len(evs) == 0 && !ended {
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		}
		for _, ev := range evs {
			out, err := event(ev)
			if err != nil {
				return connect.NewError(connect.CodeInternal, err)
			}
			if out == nil {
				continue
			}
			if err := send(out); err != nil {
				return err
			}
		}
		if ended {
			return nil
		}
	}
}

// event is a live sandbox's process event as envd's, nil for one envd
// has not (start, sent first).
func event(ev runapi.ProcessEvent) (*process.ProcessEvent, error) {
	switch ev.Event {
	case "stdout", "stderr", "pty":
		b, err := ev.Output()
		if err != nil {
			return nil, err
		}
		d := &process.ProcessEvent_DataEvent{}
		switch ev.Event {
		case "stdout":
			d.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: b}
		case "stderr":
			d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: b}
		default:
			d.Output = &process.ProcessEvent_DataEvent_Pty{Pty: b}
		}
		return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}, nil
	case "exit":
		end := &process.ProcessEvent_EndEvent{Exited: ev.Signal == ""}
		switch {
		case ev.Signal != "":
			// As Go's os.ProcessState says it, which envd answers.
			end.ExitCode, end.Status = -1, "signal: "+ev.Signal
		case ev.ExitCode != nil:
			end.ExitCode, end.Status = int32(*ev.ExitCode), "exit status "+strconv.Itoa(*ev.ExitCode)
		}
		if ev.TimedOut {
			msg := "the process ran past its timeout"
			end.Error = &msg
		}
		return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}, nil
	}
	return nil, nil
}

func (processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	c, err := callOf(ctx)
	if err != nil {
		return nil, err
	}
	t := tagsOf(c)
	res := &process.ListResponse{}
	for _, pi := range c.Sandbox.Processes() {
		if !pi.Running {
			continue
		}
		cfg := &process.ProcessConfig{Envs: map[string]string{}}
		if len(pi.Command) > 0 {
			cfg.Cmd, cfg.Args = pi.Command[0], pi.Command[1:]
		}
		res.Processes = append(res.Processes, &process.ProcessInfo{Config: cfg, Pid: uint32(pi.Pid), Tag: t.tagOf(pi.Pid)})
	}
	return connect.NewResponse(res), nil
}

// input writes in to p: stdin, or its terminal.
func input(p runapi.Process, in *process.ProcessInput) error {
	var data []byte
	switch i := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = i.Stdin
	case *process.ProcessInput_Pty:
		data = i.Pty
	}
	if len(data) == 0 {
		return nil
	}
	if err := p.WriteStdin(data, false); err != nil {
		return rpcError(err)
	}
	return nil
}

func (processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := selectedOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := input(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput takes a start naming the process, then its input in
// order; each message is bounded, and each write waits for the process.
func (processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	c, err := callOf(ctx)
	if err != nil {
		return nil, err
	}
	done, err := openStream(c)
	if err != nil {
		return nil, err
	}
	defer done()
	var p runapi.Process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			if p, err = selected(c, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start that names its process"))
			}
			if err := input(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

func (processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, err := selectedOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal: SIGTERM or SIGKILL"))
	}
	if err := p.Signal(sig); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := selectedOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.WriteStdin(nil, true); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := selectedOf(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		size := req.Msg.GetPty().GetSize()
		if err := p.Resize(runapi.TTYSize{Rows: int(size.GetRows()), Cols: int(size.GetCols())}); err != nil {
			return nil, rpcError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
