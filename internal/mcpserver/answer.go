package mcpserver

import (
	"encoding/base64"
	"fmt"
	"mime"
	"net/http"
	"path"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentrun/agentrun/internal/result"
)

// MaxFileBytes bounds the collected files returned in one answer, before
// encoding; the files past it are listed, not returned.
const MaxFileBytes = 8 << 20

// Output is run_code's structuredContent: the result's fields, with the
// collected files described (their content is in the answer's content).
// Its error is always "": a run agentrun could not run is an error answer.
type Output struct {
	result.Result
	Files map[string]OutFile `json:"files"`
}

// OutFile is one collected file in Output.
type OutFile struct {
	Size      int64  `json:"size"`
	MIMEType  string `json:"mime_type,omitempty"`
	Returned  string `json:"returned"` // "image", "resource", or "no" (Error says why)
	Truncated bool   `json:"truncated,omitempty"`
	Error     string `json:"error,omitempty"`
}

// imageTypes are the image formats returned as MCP image content.
var imageTypes = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// answer turns a run's result into run_code's answer: a text for the
// model, images and other files as content, and the fields as Output.
func answer(res *result.Result) (*mcp.CallToolResult, *Output) {
	out := &Output{Result: *res, Files: map[string]OutFile{}}
	out.Result.Files = nil
	if out.Network.Allowed == nil {
		out.Network.Allowed = []result.Allowed{}
	}
	if out.Network.Denied == nil {
		out.Network.Denied = []result.Denied{}
	}

	content := []mcp.Content{&mcp.TextContent{Text: text(res)}}
	names := make([]string, 0, len(res.Files))
	for name := range res.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	budget := MaxFileBytes
	var notes []string
	for _, name := range names {
		f := res.Files[name]
		of := OutFile{Size: f.Size, Truncated: f.Truncated, Error: f.Error, Returned: "no"}
		data, err := base64.StdEncoding.DecodeString(f.ContentBase64)
		switch {
		case f.Error != "":
		case err != nil:
			of.Error = "its content could not be decoded"
		case len(data) > budget:
			of.Error = fmt.Sprintf("over the answer's %d bytes of files", MaxFileBytes)
		default:
			budget -= len(data)
			of.MIMEType = fileType(name, data)
			if imageTypes[of.MIMEType] {
				of.Returned = "image"
				content = append(content, &mcp.ImageContent{Data: data, MIMEType: of.MIMEType})
			} else {
				of.Returned = "resource"
				rc := &mcp.ResourceContents{URI: "file:///workspace/" + name, MIMEType: of.MIMEType}
				if utf8.Valid(data) {
					rc.Text = string(data)
				} else {
					rc.Blob = data
				}
				content = append(content, &mcp.EmbeddedResource{Resource: rc})
			}
		}
		if of.Returned == "no" {
			notes = append(notes, fmt.Sprintf("%s: not returned: %s", name, of.Error))
		} else if f.Truncated {
			notes = append(notes, fmt.Sprintf("%s: returned truncated (%d bytes in all)", name, f.Size))
		}
		out.Files[name] = of
	}
	if len(notes) > 0 {
		t := content[0].(*mcp.TextContent)
		t.Text += "\ncollected files: " + strings.Join(notes, "; ")
	}
	for i, b := range res.Display {
		content = append(content, bundleContent(fmt.Sprintf("display %d", i+1), b)...)
	}
	if res.Value != nil {
		content = append(content, bundleContent("value", res.Value)...)
	}
	return &mcp.CallToolResult{Content: content}, out
}

// bundleTexts are the text MIME types of a bundle, the one given to the
// model first: a bundle's value is sent once, in the first of these it
// has (a frame's text/plain, not its text/html too); the others are in
// structuredContent.
var bundleTexts = []string{"text/markdown", "text/plain", "text/latex", "application/json", "text/html", "image/svg+xml"}

// bundleContent is the content of a MIME bundle of the result's display
// or value, called what: its images as image content, and one text as
// text content headed by what, its MIME type and the other types the
// bundle has.
func bundleContent(what string, b result.Bundle) []mcp.Content {
	var content []mcp.Content
	var shown string
	var others []string
	for _, mime := range bundleTexts {
		if _, ok := b[mime]; !ok {
			continue
		}
		if shown == "" {
			shown = mime
		} else {
			others = append(others, mime)
		}
	}
	if shown != "" {
		head := fmt.Sprintf("%s (%s)", what, shown)
		if len(others) > 0 {
			head = fmt.Sprintf("%s (%s; also %s in structuredContent)", what, shown, strings.Join(others, ", "))
		}
		content = append(content, &mcp.TextContent{Text: head + ":\n" + b[shown]})
	}
	for _, mime := range []string{"image/png", "image/jpeg"} {
		if data, err := base64.StdEncoding.DecodeString(b[mime]); err == nil && len(data) > 0 {
			content = append(content, &mcp.ImageContent{Data: data, MIMEType: mime})
		}
	}
	return content
}

// fileType is the file's MIME type: sniffed from its bytes for images,
// from its name else.
func fileType(name string, data []byte) string {
	sniffed := http.DetectContentType(data)
	if imageTypes[sniffed] {
		return sniffed
	}
	if t := mime.TypeByExtension(path.Ext(name)); t != "" && !strings.HasPrefix(t, "image/") {
		return t
	}
	if utf8.Valid(data) {
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}

// text is the answer a model reads: the output, then one line saying how
// the run ended.
func text(res *result.Result) string {
	var b strings.Builder
	section := func(name, s string, truncated bool, total int64) {
		if s == "" && !truncated {
			return
		}
		fmt.Fprintf(&b, "%s:\n%s", name, s)
		if !strings.HasSuffix(s, "\n") {
			b.WriteString("\n")
		}
		if truncated {
			fmt.Fprintf(&b, "[%s truncated: %d of %d bytes kept]\n", name, len(s), total)
		}
	}
	section("stdout", res.Stdout, res.StdoutTruncated, res.StdoutBytes)
	section("stderr", res.Stderr, res.StderrTruncated, res.StderrBytes)
	b.WriteString(outcome(res))
	return b.String()
}

// outcome is the one line on how the run ended.
func outcome(res *result.Result) string {
	var how string
	switch {
	case res.TimedOut:
		how = "timed out: killed at its time limit"
	case res.OOMKilled:
		how = "killed: out of memory (OOM)"
	case res.Signal != "":
		how = "killed by " + res.Signal
	default:
		how = fmt.Sprintf("exit code %d", res.ExitCode)
	}
	parts := []string{how, fmt.Sprintf("%d ms", res.DurationMS)}
	if res.Network.None {
		parts = append(parts, "no network")
	}
	if res.StdoutTruncated || res.StderrTruncated {
		var which []string
		if res.StdoutTruncated {
			which = append(which, "stdout")
		}
		if res.StderrTruncated {
			which = append(which, "stderr")
		}
		parts = append(parts, strings.Join(which, " and ")+" truncated")
	}
	for _, d := range res.Network.Denied {
		parts = append(parts, fmt.Sprintf("network: %s:%d refused (%s)", d.Host, d.Port, d.Reason))
	}
	return fmt.Sprintf("[%s; run %s]", strings.Join(parts, ", "), res.ID)
}
