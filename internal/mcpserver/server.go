package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/task"
)

// Version is the server version agentrun announces to clients.
const Version = "0.1.0"

// ToolName is the name of the tool that runs code.
const ToolName = "run_code"

// Bounds of one call.
const (
	// MaxCodeChars bounds run_code's code (the schema's maxLength).
	MaxCodeChars = 1 << 20
	// MaxFrameBytes bounds one inbound message, on stdio and HTTP alike:
	// code, files and stdin together, as JSON.
	MaxFrameBytes = 16 << 20
	// SessionIdle is how long an HTTP session may stay idle before it is
	// closed.
	SessionIdle = 30 * time.Minute
)

// TaskFunc runs a task (task.json bytes) and returns its result, whose
// Error is set when agentrun could not run it; or a *runapi.Refusal when
// the task was refused (bad task, above policy, over quota, busy); or
// another error when the run could not even be asked for.
// server.Server.RunTask is one. (The runner's own runapi.Func takes a
// plan already loaded; this takes the model's task as serve does.)
type TaskFunc func(ctx context.Context, taskJSON []byte) (*result.Result, error)

// Args are run_code's arguments.
type Args struct {
	Language     string            `json:"language,omitempty"`
	Code         string            `json:"code"`
	Files        map[string]string `json:"files,omitempty"`
	Stdin        string            `json:"stdin,omitempty"`
	Collect      []string          `json:"collect,omitempty"`
	NetworkAllow []string          `json:"network_allow,omitempty"`
	// NetworkServices names services of the config (network.services).
	NetworkServices []string `json:"network_services,omitempty"`
	// Tools names tool servers of the config (tools).
	Tools   []string `json:"tools,omitempty"`
	Timeout string   `json:"timeout,omitempty"`
	Session string   `json:"session,omitempty"`
	// ResetState clears the session's state before the run.
	ResetState bool `json:"reset_state,omitempty"`
}

// Server is the MCP server of one agentrun door. Create it with New.
type Server struct {
	mcp      *mcp.Server
	run      TaskFunc
	logf     func(format string, args ...any)
	fallback string // the session of a transport without session ids (stdio)

	stop   context.Context // cancelled by Close: every run is killed
	cancel context.CancelFunc
	calls  sync.WaitGroup
	after  func() // run by Close once the calls are done; may be nil

	held heldCalls[approvals.Approval, approvals.Decision, callResult] // runs waiting for their client's decision on a held request

	mu sync.Mutex
	// stateful are the languages whose runs in a kept session keep their
	// state (Python's), "" the default language when it is one of them.
	stateful map[string]bool
	ended    map[*mcp.ServerSession]chan struct{}        // closed when the session ends
	live     map[string]map[*context.CancelFunc]struct{} // the calls going on, by session id

	// The live-sandbox tools' (AddShell): how to make a sandbox, the
	// timeout each call sets again, each session's shell, and whether
	// Close ended them.
	newSandbox   SandboxFunc
	sandboxIdle  time.Duration
	shells       map[*mcp.ServerSession]*shell
	shellsClosed bool
}

// New returns the MCP server that runs code with run, describing cfg's
// languages and policy to the model. logf gets the host-side failures the
// model is not told about.
func New(cfg *config.Config, run TaskFunc, logf func(format string, args ...any)) *Server {
	s := newServer(logf, "agentrun runs code in single-use, locked-down Linux sandboxes: "+
		"no network unless asked for, no secrets, bounded time, memory and output.")
	s.run = run
	s.Reload(cfg)
	return s
}

// Reload describes cfg to the model from now on (serve's reload): its
// languages, limits, policy, services and tools in run_code's
// description and input schema, which replace the tool's before (the
// SDK tells the clients that the tool list changed), and the languages
// whose runs in a kept session keep their state.
func (s *Server) Reload(cfg *config.Config) {
	stateful := map[string]bool{}
	for _, name := range pythonNames(cfg) {
		stateful[name] = true
	}
	stateful[""] = stateful[cfg.Language]
	s.mu.Lock()
	s.stateful = stateful
	s.sandboxIdle = cfg.Sandboxes.DefaultTimeout.Duration()
	s.mu.Unlock()
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:         ToolName,
		Title:        "Run code in a sandbox",
		Description:  toolDescription(cfg),
		InputSchema:  inputSchema(cfg),
		OutputSchema: outputSchema(),
		Annotations:  &mcp.ToolAnnotations{OpenWorldHint: ptr(true), DestructiveHint: ptr(false)},
	}, s.runCode)
}

func ptr[T any](v T) *T { return &v }

// MCP is the SDK server, for transports of the caller's choosing.
func (s *Server) MCP() *mcp.Server { return s.mcp }

// ServeStdio serves one client over stdin and stdout until it closes
// them or ctx ends, then kills the runs going on and waits until their
// sandboxes are gone.
func (s *Server) ServeStdio(ctx context.Context) error {
	err := s.mcp.Run(ctx, &mcp.StdioTransport{MaxLineLength: MaxFrameBytes})
	s.Close()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// HTTPHandler serves MCP as Streamable HTTP (for serve's /mcp). A client
// that ends its session (DELETE, as a forwarding `agentrun mcp` does when
// its own client leaves) kills the session's runs first: the SDK closes a
// session only once its calls have returned, so without this the DELETE
// would wait for the runs to end by themselves. The session's live
// sandbox is gone before the DELETE is answered.
func (s *Server) HTTPHandler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{SessionTimeout: SessionIdle, MaxRequestBodyBytes: MaxFrameBytes})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		if r.Method != http.MethodDelete || id == "" {
			h.ServeHTTP(w, r)
			return
		}
		s.cancelSession(id)
		s.endShellOf(id)
		h.ServeHTTP(w, r)
	})
}

// cancelSession kills the runs of the calls going on in session id.
func (s *Server) cancelSession(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for cancel := range s.live[id] {
		(*cancel)()
	}
}

// Close kills the runs going on and waits until their sandboxes are
// gone, then ends every session's live sandbox.
func (s *Server) Close() {
	s.cancel()
	s.calls.Wait()
	s.closeShells()
	if s.after != nil {
		s.after()
	}
}

// Shutdown lets the calls going on finish, or kills their runs when ctx
// ends first, then closes every session (ending their HTTP streams).
func (s *Server) Shutdown(ctx context.Context) {
	done := make(chan struct{})
	go func() { s.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	s.Close()
	for ss := range s.mcp.Sessions() {
		ss.Close()
	}
}

// track counts a call going on and ties its context to Close and to the
// end of its session (a client gone), which kill its run.
func (s *Server) track(ctx context.Context, ss *mcp.ServerSession) (context.Context, func()) {
	s.calls.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.stop, cancel)
	untrack := func() {}
	if ss != nil && ss.ID() != "" {
		id, key := ss.ID(), &cancel
		s.mu.Lock()
		if s.live == nil {
			s.live = map[string]map[*context.CancelFunc]struct{}{}
		}
		if s.live[id] == nil {
			s.live[id] = map[*context.CancelFunc]struct{}{}
		}
		s.live[id][key] = struct{}{}
		s.mu.Unlock()
		untrack = func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if delete(s.live[id], key); len(s.live[id]) == 0 {
				delete(s.live, id)
			}
		}
	}
	if ss != nil {
		ended := s.sessionEnded(ss)
		go func() {
			select {
			case <-ended:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, func() { untrack(); stop(); cancel(); s.calls.Done() }
}

// sessionEnded is closed when ss has ended: one watcher per session.
func (s *Server) sessionEnded(ss *mcp.ServerSession) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.ended[ss]; ok {
		return ch
	}
	if s.ended == nil {
		s.ended = map[*mcp.ServerSession]chan struct{}{}
	}
	ch := make(chan struct{})
	s.ended[ss] = ch
	go func() {
		ss.Wait()
		s.mu.Lock()
		delete(s.ended, ss)
		s.mu.Unlock()
		close(ch)
	}()
	return ch
}

func newServer(logf func(format string, args ...any), instructions string) *Server {
	s := &Server{logf: logf, fallback: "mcp-" + randomHex(8)}
	s.stop, s.cancel = context.WithCancel(context.Background())
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "agentrun", Version: Version}, &mcp.ServerOptions{Instructions: instructions})
	s.mcp.AddReceivingMiddleware(boundErrors, everyRound)
	return s
}

// MaxErrorChars bounds the text of an error answer: the SDK's argument
// validation quotes the value at fault, which may be megabytes of code.
const MaxErrorChars = 2048

// boundErrors cuts the texts of error answers to MaxErrorChars.
func boundErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*mcp.CallToolResult); ok && r.IsError {
			for _, c := range r.Content {
				if t, ok := c.(*mcp.TextContent); ok && len(t.Text) > MaxErrorChars {
					cut := MaxErrorChars
					for cut > 0 && !utf8.RuneStart(t.Text[cut]) {
						cut--
					}
					t.Text = t.Text[:cut] + fmt.Sprintf("… [%d more bytes cut]", len(t.Text)-cut)
				}
			}
		}
		return res, err
	}
}

// runCode is run_code: the arguments become a task, the result an answer.
func (s *Server) runCode(ctx context.Context, req *mcp.CallToolRequest, args Args) (*mcp.CallToolResult, any, error) {
	ctx, done := s.track(ctx, req.Session)
	defer done()

	// A run in a kept session is counted (quotas, audit) under that
	// session's id; any other under the MCP session's.
	session := args.Session
	if session == "" {
		session = s.fallback
		if req.Session != nil && req.Session.ID() != "" {
			session = "mcp-" + req.Session.ID()
		}
		if len(session) > task.MaxSessionLen {
			session = session[:task.MaxSessionLen]
		}
	}
	s.mu.Lock()
	stateful := s.stateful[args.Language]
	s.mu.Unlock()
	taskJSON, err := json.Marshal(toTask(args, session, stateful))
	if err != nil {
		return nil, nil, fmt.Errorf("encoding the task: %w", err)
	}
	res, held, err := s.runAsking(ctx, req, taskJSON)
	if held != nil {
		return inputRequired(held, callTag(req)), nil, nil
	}
	switch {
	case ctx.Err() != nil:
		// The client cancelled the call or left: the run was killed.
		return cancelled(), nil, nil
	case err != nil:
		return s.toolError(ToolName, session, err), nil, nil
	case res.Error != "":
		if k := errkind.Of(res.Err); k == errkind.Busy || k == errkind.NotFound || k == errkind.TooLarge {
			// A kept session taken (or removed) by another call between
			// the server's check and the run's lock: refused, as the
			// check refuses it (and serve answers 409, 404); files that
			// do not fit in the workspace or the session's disk: refused
			// naming the file and the bound (serve answers 413).
			return s.toolError(ToolName, session, res.Err), nil, nil
		}
		// An image of the config that cannot be had, a workspace that
		// could not be made: the host's, whatever its kind.
		s.logf("run %s (session %s): %s", res.ID, session, res.Error)
		return hostFailure(ToolName, res.ID), nil, nil
	}
	ans, out := answer(res)
	return ans, out, nil
}

// taskJSON is the task a call becomes, as task.json spells it.
type taskJSON struct {
	Session  string               `json:"session"`
	Keep     bool                 `json:"keep_workspace,omitempty"`
	State    bool                 `json:"keep_state,omitempty"`
	Reset    bool                 `json:"reset_state,omitempty"`
	Language string               `json:"language,omitempty"`
	Code     string               `json:"code"`
	Stdin    string               `json:"stdin,omitempty"`
	Files    map[string]task.File `json:"files,omitempty"`
	Collect  []string             `json:"collect,omitempty"`
	Network  *task.Network        `json:"network,omitempty"`
	Tools    []string             `json:"tools,omitempty"`
	Limits   *struct {
		Timeout string `json:"timeout"`
	} `json:"limits,omitempty"`
}

// toTask is the task of call a, under session; a run in a kept session of
// a stateful language keeps its state.
func toTask(a Args, session string, stateful bool) taskJSON {
	t := taskJSON{Session: session, Keep: a.Session != "", Language: a.Language, Code: a.Code, Stdin: a.Stdin, Collect: a.Collect,
		Tools: a.Tools, State: a.Session != "" && stateful, Reset: a.ResetState}
	if len(a.Files) > 0 {
		t.Files = make(map[string]task.File, len(a.Files))
		for name, content := range a.Files {
			t.Files[name] = task.File{Content: &content}
		}
	}
	if len(a.NetworkAllow) > 0 || len(a.NetworkServices) > 0 {
		t.Network = &task.Network{Allow: a.NetworkAllow, Services: a.NetworkServices}
	}
	if a.Timeout != "" {
		t.Limits = &struct {
			Timeout string `json:"timeout"`
		}{a.Timeout}
	}
	return t
}

// argNames maps a task field, as a refusal names it, to the argument the
// model wrote.
var argNames = []struct{ field, arg string }{
	{"limits.timeout", "timeout"},
	{"network.allow", "network_allow"},
	{"network.services", "network_services"},
}

// toolDescription tells the model what run_code does and what it may ask.
func toolDescription(cfg *config.Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run a program in a fresh, single-use, locked-down Linux sandbox (image %s) and get its output. ", cfg.Image)
	fmt.Fprintf(&b, "Languages: %s (default %s). ", strings.Join(config.LanguageNames(cfg), ", "), cfg.Language)
	b.WriteString("The code runs as an unprivileged user in /workspace, with a read-only root and writable /tmp and /workspace; nothing is kept after the run, " +
		"unless session names a kept session (from new_session, where offered): then /workspace is that session's and stays for its next runs. ")
	if allowNetwork(cfg) {
		b.WriteString("There is no network unless network_allow names the hosts to reach (through a proxy; everything else is refused). ")
	} else {
		b.WriteString("There is no network. ")
	}
	if len(cfg.Tools) > 0 {
		b.WriteString("Tools: the program can call the tools of the tool servers that tools names, through agentrun (no network needed): " +
			"GET http://tools.agentrun/v1/tools lists them, POST http://tools.agentrun/v1/call runs one, " +
			"and Python code can `from agentrun_tools import SERVER` and call SERVER.TOOL(arg=...). ")
	}
	fmt.Fprintf(&b, "Limits: timeout %s by default, at most %s; memory %s; output kept %d bytes per stream. ",
		cfg.Limits.Timeout, cfg.Policy.Timeout, cfg.Limits.Memory, deref(cfg.Limits.OutputBytes))
	if py := pythonNames(cfg); len(py) > 0 {
		fmt.Fprintf(&b, "In Python (%s), as in a notebook: the value of a final expression comes back (its text, or a table's), "+
			"and so do matplotlib figures shown with plt.show() or left open, as images, and whatever display(obj) shows; "+
			"no need to print them. ", strings.Join(py, ", "))
	}
	b.WriteString("Files listed in collect come back: images as images, other files as resources. " +
		"A non-zero exit, a timeout or an out-of-memory kill is a normal answer that says so.")
	return b.String()
}

// pythonNames are the config's languages that run Python (those whose
// runs give a value and figures), sorted.
func pythonNames(cfg *config.Config) []string {
	var names []string
	for _, name := range config.LanguageNames(cfg) {
		if task.IsPython(&task.Plan{CodeFile: task.CodeFileName(name), Argv: cfg.Languages[name]}) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

func allowNetwork(cfg *config.Config) bool {
	return cfg.Policy.AllowNetwork == nil || *cfg.Policy.AllowNetwork
}

func deref[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}

// inputSchema is run_code's input schema: the config's languages, and the
// policy's maxima in the descriptions.
func inputSchema(cfg *config.Config) *jsonschema.Schema {
	langs := config.LanguageNames(cfg)
	sort.Strings(langs)
	enum := make([]any, len(langs))
	for i, l := range langs {
		enum[i] = l
	}
	str := func(desc string) *jsonschema.Schema { return &jsonschema.Schema{Type: "string", Description: desc} }
	pathItem := func() *jsonschema.Schema {
		return &jsonschema.Schema{Type: "string", MinLength: ptr(1), MaxLength: ptr(task.MaxPathLen)}
	}
	props := map[string]*jsonschema.Schema{
		"language": {Type: "string", Enum: enum, MaxLength: ptr(64), Description: "Language of code (default " + cfg.Language + ")."},
		"code": {Type: "string", MaxLength: ptr(MaxCodeChars),
			Description: "The program's source, written to a file in /workspace and run."},
		"files": {Type: "object", MaxProperties: ptr(task.MaxFiles),
			PropertyNames:        pathItem(),
			AdditionalProperties: &jsonschema.Schema{Type: "string"},
			Description: fmt.Sprintf("Text files written into /workspace before the run: relative path -> content "+
				"(all files at most %s by default, %s at most).", cfg.Limits.WorkspaceSize, cfg.Policy.WorkspaceSize)},
		"stdin": str("Standard input of the program."),
		"collect": {Type: "array", Items: pathItem(), MaxItems: ptr(task.MaxCollect),
			Description: "Globs relative to /workspace of files to return after the run, e.g. [\"out/*.png\", \"report.md\"]."},
		"session": {Type: "string", Pattern: `^ss-[0-9a-f]{32}$`,
			Description: "A kept session's id (from new_session): the run's /workspace is that session's, kept after the run, " +
				"with files and the code file written over it; Python code there also starts with the globals the session's last Python run left " +
				"(variables, functions, classes, imports), as in a notebook, and leaves its own. Absent: a fresh /workspace, gone after the run."},
		"reset_state": {Type: "boolean",
			Description: "With session: forget the session's Python globals before this run (its files stay)."},
		"timeout": {Type: "string", Pattern: `^[0-9]+(\.[0-9]+)?(ms|s|m|h)([0-9]+(\.[0-9]+)?(ms|s|m))*$`,
			Description: fmt.Sprintf("Wall-clock limit, a duration such as \"10s\" or \"1m\": %s by default, at most %s.",
				cfg.Limits.Timeout, cfg.Policy.Timeout)},
	}
	// What this host does not offer is left out: the model is not shown
	// a parameter it could only be refused for.
	if allowNetwork(cfg) {
		props["network_allow"] = &jsonschema.Schema{Type: "array", Items: &jsonschema.Schema{Type: "string", MinLength: ptr(1), MaxLength: ptr(260)},
			MaxItems: ptr(task.MaxAllow),
			Description: "Hosts the program may reach, e.g. [\"pypi.org\", \"*.pythonhosted.org\", \"api.example.com:8443\"] " +
				"(port 443 and 80 when none is given). Absent or empty: no network at all."}
	}
	if sc := services(cfg); sc != nil {
		props["network_services"] = sc
	}
	if sc := toolServers(cfg); sc != nil {
		props["tools"] = sc
	}
	return &jsonschema.Schema{
		Type:                 "object",
		Required:             []string{"code"},
		Properties:           props,
		AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}},
	}
}

// services is the schema of network_services: the config's services;
// nil when the host offers none (none configured, or no network).
func services(cfg *config.Config) *jsonschema.Schema {
	names := enumOf(cfg.Network.Services)
	if len(names) == 0 || !allowNetwork(cfg) {
		return nil
	}
	return &jsonschema.Schema{Type: "array", Items: &jsonschema.Schema{Type: "string", Enum: names}, MaxItems: ptr(len(names)),
		Description: "Services the program may call by their URL (HTTPS through the proxy, which adds their credentials: " +
			"the program never sees them, and only the requests the operator's rules allow pass; some wait for a human's approval)."}
}

// toolServers is the schema of tools: the config's tool servers; nil
// when none is configured.
func toolServers(cfg *config.Config) *jsonschema.Schema {
	names := enumOf(cfg.Tools)
	if len(names) == 0 {
		return nil
	}
	return &jsonschema.Schema{Type: "array", Items: &jsonschema.Schema{Type: "string", Enum: names}, MaxItems: ptr(len(names)),
		Description: "Tool servers (MCP servers on the host) whose tools the program may call from its code, with or without network: " +
			"the sandbox reaches them at http://tools.agentrun (GET /v1/tools lists the allowed tools and their input schemas; " +
			"POST /v1/call with {\"server\", \"tool\", \"arguments\"} answers with the tool's MCP result), and Python code can " +
			"`from agentrun_tools import NAME` and call NAME.TOOL(arg=...), which raises agentrun_tools.ToolError when refused. " +
			"The credentials stay on the host; only the tools the operator's rules allow run, some after a human's approval."}
}

// enumOf is the sorted keys of m, as a schema's enum.
func enumOf[V any](m map[string]V) []any {
	names := make([]any, 0, len(m))
	for _, n := range slices.Sorted(maps.Keys(m)) {
		names = append(names, n)
	}
	return names
}

// outputSchema describes structuredContent: Output.
func outputSchema() *jsonschema.Schema {
	s, err := jsonschema.For[Output](nil)
	if err != nil {
		panic(fmt.Sprintf("run_code output schema: %v", err)) // a fixed type: a bug here
	}
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
