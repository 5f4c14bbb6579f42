// Package openapitest checks HTTP answers against serve's OpenAPI document
// (server.OpenAPI), for the tests: an answer whose path, method, status,
// headers or body the document does not describe is an error. Bodies are
// validated with a JSON Schema 2020-12 validator
// (github.com/santhosh-tekuri/jsonschema/v6), the dialect of OpenAPI 3.1;
// it never runs in agentrun itself.
package openapitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentrun/agentrun/internal/server"
)

// docURL is where the compiler holds the document; schemas are compiled
// at JSON pointers into it, so that their $refs resolve in it.
const docURL = "file:///agentrun/openapi.json"

// Doc is the API's document, with its schemas compiled as they are used.
// It records which answers it has checked (Seen). Safe for concurrent use.
type Doc struct {
	raw      map[string]any
	compiler *jsonschema.Compiler

	mu      sync.Mutex
	schemas map[string]*jsonschema.Schema // by JSON pointer
	seen    map[string]bool               // "METHOD /template STATUS"
}

// Load parses server.OpenAPI.
func Load() (*Doc, error) {
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(server.OpenAPI))
	if err != nil {
		return nil, fmt.Errorf("parsing openapi.json: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	c.AssertContent()
	if err := c.AddResource(docURL, raw); err != nil {
		return nil, fmt.Errorf("openapi.json: %w", err)
	}
	doc, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("openapi.json is not an object")
	}
	return &Doc{raw: doc, compiler: c, schemas: map[string]*jsonschema.Schema{}, seen: map[string]bool{}}, nil
}

// Schema is the schema at ptr, a JSON pointer into the document
// ("/components/schemas/Result").
func (d *Doc) Schema(ptr string) (*jsonschema.Schema, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.schemas[ptr]; s != nil {
		return s, nil
	}
	s, err := d.compiler.Compile(docURL + "#" + ptr)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", ptr, err)
	}
	d.schemas[ptr] = s
	return s, nil
}

// Validate validates the JSON body against the schema at ptr.
func (d *Doc) Validate(ptr string, body []byte) error {
	s, err := d.Schema(ptr)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not JSON: %w: %.200q", err, body)
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("%.300s\ndoes not match %s: %v", body, ptr, err)
	}
	return nil
}

// Operations are the document's operations, "METHOD /template".
func (d *Doc) Operations() []string {
	var ops []string
	for tmpl, item := range d.obj("paths") {
		for m := range item.(map[string]any) {
			if isMethod(m) {
				ops = append(ops, strings.ToUpper(m)+" "+tmpl)
			}
		}
	}
	slices.Sort(ops)
	return ops
}

// Responses are the statuses the document declares for op ("METHOD
// /template"), as "METHOD /template STATUS".
func (d *Doc) Responses(op string) []string {
	method, tmpl, _ := strings.Cut(op, " ")
	var out []string
	o, _ := d.obj("paths", tmpl)[strings.ToLower(method)].(map[string]any)
	resps, _ := o["responses"].(map[string]any)
	for status := range resps {
		out = append(out, op+" "+status)
	}
	slices.Sort(out)
	return out
}

// Seen says whether an answer of op ("METHOD /template") with status was
// checked; status "" for any.
func (d *Doc) Seen(op, status string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if status != "" {
		return d.seen[op+" "+status]
	}
	for k := range d.seen {
		if strings.HasPrefix(k, op+" ") {
			return true
		}
	}
	return false
}

// Check checks an answer to method on path (the request's URL path):
// its status must be declared for the operation, with the headers the
// document requires and a body of a declared content type that matches
// its schema (each line of NDJSON, one value). A path the document does
// not have must be answered 404, a method it does not take there 405,
// both with the API's error body.
func (d *Doc) Check(method, path string, status int, h http.Header, body []byte) error {
	tmpl, ok := d.match(path)
	if !ok {
		if status != http.StatusNotFound {
			return fmt.Errorf("%s %s: status %d for a path the document does not have; want 404", method, path, status)
		}
		return d.checkResponse(method, path, "/components/responses/NotFound", h, body)
	}
	item := d.obj("paths", tmpl)
	if _, ok := item[strings.ToLower(method)]; !ok {
		if status != http.StatusMethodNotAllowed {
			return fmt.Errorf("%s %s: status %d for a method the document does not have at %s; want 405", method, path, status, tmpl)
		}
		// A path may say how it refuses other methods, as /mcp does.
		ptr := "/components/responses/MethodNotAllowed"
		if alt, ok := item["x-method-not-allowed"].(map[string]any); ok {
			ref, _ := alt["$ref"].(string)
			ptr = strings.TrimPrefix(ref, "#")
		}
		return d.checkResponse(method, path, ptr, h, body)
	}
	op := "/paths/" + escape(tmpl) + "/" + strings.ToLower(method) + "/responses/"
	code := strconv.Itoa(status)
	if d.at(op+code) == nil {
		return fmt.Errorf("%s %s: status %d is not declared for %s %s", method, path, status, method, tmpl)
	}
	if err := d.checkResponse(method, path, op+code, h, body); err != nil {
		return err
	}
	d.mu.Lock()
	d.seen[method+" "+tmpl+" "+code] = true
	d.mu.Unlock()
	return nil
}

// checkResponse checks headers and body against the response object at ptr.
func (d *Doc) checkResponse(method, path, ptr string, h http.Header, body []byte) error {
	ptr, resp := d.deref(ptr)
	where := fmt.Sprintf("%s %s (%s)", method, path, ptr)
	headers, _ := resp["headers"].(map[string]any)
	for name := range headers {
		hptr, hdr := d.deref(ptr + "/headers/" + escape(name))
		v := h.Get(name)
		if v == "" {
			if req, _ := hdr["required"].(bool); req {
				return fmt.Errorf("%s: no %s header", where, name)
			}
			continue
		}
		if err := d.Validate(hptr+"/schema", mustJSON(v)); err != nil {
			return fmt.Errorf("%s: header %s: %w", where, name, err)
		}
	}
	content, _ := resp["content"].(map[string]any)
	if method == http.MethodHead || len(content) == 0 {
		if len(body) > 0 {
			return fmt.Errorf("%s: a body where the document declares none: %.200q", where, body)
		}
		return nil
	}
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil {
		return fmt.Errorf("%s: Content-Type %q: %v", where, h.Get("Content-Type"), err)
	}
	if _, ok := content[mt]; !ok {
		if _, any := content["*/*"]; any {
			return nil // an answer passed on as it is
		}
		return fmt.Errorf("%s: Content-Type %s is not declared", where, mt)
	}
	sptr := ptr + "/content/" + escape(mt) + "/schema"
	switch mt {
	case "application/json":
		if err := d.Validate(sptr, body); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	case "application/x-ndjson":
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(nil, 64<<20)
		for n := 1; sc.Scan(); n++ {
			if err := d.Validate(sptr, sc.Bytes()); err != nil {
				return fmt.Errorf("%s: line %d: %w", where, n, err)
			}
		}
		if err := sc.Err(); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// match finds the path template path falls under. A last parameter named
// path takes the rest of the path, slashes included (a session's file).
func (d *Doc) match(path string) (string, bool) {
	segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for tmpl := range d.obj("paths") {
		ts := strings.Split(strings.TrimPrefix(tmpl, "/"), "/")
		if matchSegs(ts, segs) {
			return tmpl, true
		}
	}
	return "", false
}

func matchSegs(ts, segs []string) bool {
	for i, t := range ts {
		if i >= len(segs) {
			return false
		}
		param := strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}")
		switch {
		case param && i == len(ts)-1 && t == "{path}":
			return strings.Join(segs[i:], "/") != ""
		case param:
			if segs[i] == "" {
				return false
			}
		case t != segs[i]:
			return false
		}
	}
	return len(ts) == len(segs)
}

// deref follows $refs from ptr and returns where it ends and the object there.
func (d *Doc) deref(ptr string) (string, map[string]any) {
	for range 8 {
		o, _ := d.at(ptr).(map[string]any)
		ref, ok := o["$ref"].(string)
		if !ok {
			return ptr, o
		}
		ptr = strings.TrimPrefix(ref, "#")
	}
	return ptr, nil
}

// at is the value at the JSON pointer ptr, nil if there is none.
func (d *Doc) at(ptr string) any {
	var v any = d.raw
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		o, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = o[strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")]
	}
	return v
}

// obj is the object at the path of keys.
func (d *Doc) obj(keys ...string) map[string]any {
	var ptr string
	for _, k := range keys {
		ptr += "/" + escape(k)
	}
	o, _ := d.at(ptr).(map[string]any)
	return o
}

// escape escapes a key for a JSON pointer.
func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

func isMethod(m string) bool {
	switch m {
	case "get", "put", "post", "delete", "options", "head", "patch", "trace":
		return true
	}
	return false
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
