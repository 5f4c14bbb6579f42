package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// Names of the kept-session tools.
const (
	NewSessionTool = "new_session"
	ListFilesTool  = "list_files"
	ReadFileTool   = "read_file"
	WriteFileTool  = "write_file"
	ForkTool       = "fork_session"
)

// SessionArgs are list_files' arguments.
type SessionArgs struct {
	Session string `json:"session" jsonschema:"a kept session's id, from new_session"`
	Path    string `json:"path,omitempty" jsonschema:"a directory relative to /workspace to list (default: all)"`
}

// FileArgs are read_file's arguments.
type FileArgs struct {
	Session string `json:"session" jsonschema:"a kept session's id, from new_session"`
	Path    string `json:"path" jsonschema:"the file's path relative to /workspace"`
}

// WriteArgs are write_file's arguments.
type WriteArgs struct {
	Session string `json:"session" jsonschema:"a kept session's id, from new_session"`
	Path    string `json:"path" jsonschema:"the file's path relative to /workspace; parent directories are made"`
	Content string `json:"content" jsonschema:"the file's text, at most 16 MiB; it replaces what was there"`
}

// ForkArgs are fork_session's arguments.
type ForkArgs struct {
	Session string `json:"session" jsonschema:"a kept session's id, from new_session"`
	Count   int    `json:"count" jsonschema:"how many copies to make, 1 to 64"`
}

// ForkOutput is fork_session's structuredContent.
type ForkOutput struct {
	Sessions []string `json:"sessions"`
}

// NewSessionOutput is new_session's structuredContent.
type NewSessionOutput struct {
	Session string `json:"session"`
}

// AddSessions adds the kept-session tools on store: new_session,
// list_files, read_file, write_file and fork_session. run_code's session argument needs
// no store here: the run's own door (server.Server.RunTask, whose
// Sessions should be store too) refuses an unknown or busy session.
// The file tools go through store, which binds every name to the
// session's root and caps sizes and listings.
func (s *Server) AddSessions(store *session.Store) {
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  NewSessionTool,
		Title: "Make a kept workspace",
		Description: "Make a kept session: a /workspace that outlives runs. Give its id as run_code's session to run in it, " +
			"and to list_files, read_file and write_file. It is removed after a time without use.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, tracked(s, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, NewSessionOutput, error) {
		id, err := store.Create()
		if err != nil {
			return s.toolError(NewSessionTool, "", err), NewSessionOutput{}, nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "session " + id}}}, NewSessionOutput{Session: id}, nil
	}))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:        ListFilesTool,
		Title:       "List a kept workspace's files",
		Description: fmt.Sprintf("List the files of a kept session's /workspace: type, size and name, at most %d entries.", session.MaxList),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, tracked(s, func(ctx context.Context, _ *mcp.CallToolRequest, a SessionArgs) (*mcp.CallToolResult, *session.Listing, error) {
		dir := strings.TrimSuffix(a.Path, "/")
		if dir == "." {
			dir = ""
		}
		if dir != "" {
			if reason := task.CheckRelPath(dir); reason != "" {
				return s.toolError(ListFilesTool, a.Session, fmt.Errorf("%w: %s", session.ErrBadPath, reason)), nil, nil
			}
		}
		l, err := store.Files(a.Session)
		if err != nil {
			return s.toolError(ListFilesTool, a.Session, err), nil, nil
		}
		out := &session.Listing{Files: []session.File{}, Truncated: l.Truncated}
		var b strings.Builder
		for _, f := range l.Files {
			if dir != "" && !strings.HasPrefix(f.Name, dir+"/") {
				continue
			}
			out.Files = append(out.Files, f)
			fmt.Fprintf(&b, "%s\t%d\t%q\n", f.Type, f.Size, f.Name)
		}
		if len(out.Files) == 0 {
			b.WriteString("no files\n")
		}
		if out.Truncated {
			fmt.Fprintf(&b, "[listing cut at %d entries or %d levels]\n", session.MaxList, session.MaxListDepth)
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
	}))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  ReadFileTool,
		Title: "Read a file of a kept workspace",
		Description: fmt.Sprintf("Read a regular file of a kept session's /workspace, at most %d bytes: "+
			"its text when UTF-8, else a blob resource. Symlinks are refused, not followed.", session.MaxFileBytes),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, tracked(s, func(ctx context.Context, _ *mcp.CallToolRequest, a FileArgs) (*mcp.CallToolResult, any, error) {
		data, err := store.ReadFile(a.Session, a.Path)
		if err != nil {
			return s.toolError(ReadFileTool, a.Session, err), nil, nil
		}
		if utf8.Valid(data) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(data)}}}, nil, nil
		}
		rc := &mcp.ResourceContents{URI: "file:///workspace/" + a.Path, MIMEType: fileType(a.Path, data), Blob: data}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.EmbeddedResource{Resource: rc}}}, nil, nil
	}))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  WriteFileTool,
		Title: "Write a file of a kept workspace",
		Description: fmt.Sprintf("Write a text file into a kept session's /workspace (at most %d bytes), "+
			"replacing what was there; parent directories are made.", session.MaxFileBytes),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	}, tracked(s, func(ctx context.Context, _ *mcp.CallToolRequest, a WriteArgs) (*mcp.CallToolResult, any, error) {
		if err := store.WriteFile(a.Session, a.Path, strings.NewReader(a.Content)); err != nil {
			return s.toolError(WriteFileTool, a.Session, err), nil, nil
		}
		text := fmt.Sprintf("wrote %d bytes to %s", len(a.Content), a.Path)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
	}))
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name:  ForkTool,
		Title: "Copy a kept workspace N ways",
		Description: fmt.Sprintf("Make count new kept sessions (1 to %d), each a copy of the session's /workspace, "+
			"independent from then on: to try several ways on from one point.", session.MaxFork),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	}, tracked(s, func(ctx context.Context, _ *mcp.CallToolRequest, a ForkArgs) (*mcp.CallToolResult, ForkOutput, error) {
		f, err := store.Fork(ctx, a.Session, a.Count)
		if err != nil {
			return s.toolError(ForkTool, a.Session, err), ForkOutput{}, nil
		}
		text := "sessions " + strings.Join(f.IDs, " ")
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, ForkOutput{Sessions: f.IDs}, nil
	}))
}

// tracked wraps a tool's handler so that Close waits for its call.
func tracked[In, Out any](s *Server, h mcp.ToolHandlerFor[In, Out]) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		ctx, done := s.track(ctx, req.Session)
		defer done()
		return h(ctx, req, in)
	}
}
