package server_test

import (
	"context"
	"encoding"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/result"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/server"
	"github.com/agentrun/agentrun/internal/server/openapitest"
	"github.com/agentrun/agentrun/internal/session"
	"github.com/agentrun/agentrun/internal/task"
)

// goSchemas are the document's schemas that Go types encode, and those
// types. Input: decoded from a client, so which fields are present is the
// client's choice; the rest are answers, where a field without omitempty
// is always present.
var goSchemas = map[string]struct {
	typ   reflect.Type
	input bool
}{
	"Task":           {reflect.TypeFor[task.Task](), true},
	"TaskFile":       {reflect.TypeFor[task.File](), true},
	"TaskNetwork":    {reflect.TypeFor[task.Network](), true},
	"Limits":         {reflect.TypeFor[config.Limits](), true},
	"Decision":       {reflect.TypeFor[server.Decision](), true},
	"Result":         {reflect.TypeFor[result.Result](), false},
	"Network":        {reflect.TypeFor[result.Network](), false},
	"Allowed":        {reflect.TypeFor[result.Allowed](), false},
	"Denied":         {reflect.TypeFor[result.Denied](), false},
	"Failed":         {reflect.TypeFor[result.Failed](), false},
	"ServiceRequest": {reflect.TypeFor[result.ServiceRequest](), false},
	"ApprovalRecord": {reflect.TypeFor[result.Approval](), false},
	"CollectedFile":  {reflect.TypeFor[result.File](), false},
	"Collect":        {reflect.TypeFor[result.Collect](), false},
	"HeldRequest":    {reflect.TypeFor[approvals.Approval](), false},
	"Event":          {reflect.TypeFor[server.Event](), false},
	"Health":         {reflect.TypeFor[server.Health](), false},
	"PoolHealth":     {reflect.TypeFor[server.PoolHealth](), false},
	"Error":          {reflect.TypeFor[server.APIError](), false},
	"SessionInfo":    {reflect.TypeFor[server.SessionInfo](), false},
	"SessionFile":    {reflect.TypeFor[session.File](), false},
	"SandboxRequest": {reflect.TypeFor[server.SandboxRequest](), true},
	"ProcessRequest": {reflect.TypeFor[server.ProcessRequest](), true},
	"StdinRequest":   {reflect.TypeFor[server.StdinRequest](), true},
	"TTYSize":        {reflect.TypeFor[server.TTYSize](), true},
	"Sandbox":        {reflect.TypeFor[runapi.SandboxInfo](), false},
	"ProcessEvent":   {reflect.TypeFor[runapi.ProcessEvent](), false},
	"ProcessInfo":    {reflect.TypeFor[runapi.ProcessInfo](), false},
	"SandboxFile":    {reflect.TypeFor[runapi.FileInfo](), false},
	"ApprovalsPage":  {reflect.TypeFor[server.UIList](), false},
	"PageHeld":       {reflect.TypeFor[server.UIList]().Field(0).Type.Elem(), false},
	"PageDecided":    {reflect.TypeFor[approvals.Decided](), false},
	"WebhookHold":    {reflect.TypeFor[approvals.Hold](), false},
	"ForkRequest":    {reflect.TypeFor[server.ForkRequest](), true},
	"State":          {reflect.TypeFor[result.State](), false},
	"ForkAnswer":     {reflect.TypeFor[server.ForkAnswer](), false},
	"ForkedSession":  {reflect.TypeFor[server.ForkedSession](), false},
	"Tools":          {reflect.TypeFor[result.Tools](), false},
	"ToolCall":       {reflect.TypeFor[result.ToolCall](), false},
}

// handWritten are the document's schemas of no Go type: formats, and
// answers written as maps (a result's Bundle).
var handWritten = []string{"Size", "Duration", "DecisionTaken", "NewSession", "JSONRPCMessage", "Bundle", "ProcessStarted"}

func openapiDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(server.OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return doc
}

// TestOpenAPIMatchesGoTypes: each schema of a Go type has exactly the
// type's JSON fields, each of the JSON type it encodes to (a struct as a
// $ref to its own type's schema), and, in an answer, requires exactly the
// fields Go always writes and allows null where Go writes null (a nil
// slice, map or pointer without omitempty). A field added to either side, or
// a type changed, fails here.
func TestOpenAPIMatchesGoTypes(t *testing.T) {
	schemas := openapiDoc(t)["components"].(map[string]any)["schemas"].(map[string]any)
	byType := map[reflect.Type]string{}
	for name, g := range goSchemas {
		byType[g.typ] = name
	}
	for name := range schemas {
		if _, ok := goSchemas[name]; !ok && !slices.Contains(handWritten, name) {
			t.Errorf("schema %s: no Go type; add it to goSchemas or handWritten", name)
		}
	}
	for name, g := range goSchemas {
		s, ok := schemas[name].(map[string]any)
		if !ok {
			t.Errorf("schema %s (%v) missing", name, g.typ)
			continue
		}
		if s["type"] != "object" || s["additionalProperties"] != false {
			t.Errorf("schema %s: want type object and additionalProperties false", name)
		}
		props, _ := s["properties"].(map[string]any)
		var required []string
		for _, r := range asSlice(s["required"]) {
			required = append(required, r.(string))
		}
		fields := jsonFields(g.typ)
		for _, f := range fields {
			p, ok := props[f.name].(map[string]any)
			if !ok {
				t.Errorf("%s.%s (%v) is not in schema %s", g.typ, f.name, f.typ, name)
				continue
			}
			if err := sameType(schemas, byType, p, f.typ, !g.input && !f.omitempty); err != "" {
				t.Errorf("schema %s property %s: %s", name, f.name, err)
			}
			if !g.input && !f.omitempty && !slices.Contains(required, f.name) {
				t.Errorf("schema %s: %s is always in the answer but not required", name, f.name)
			}
			if !g.input && f.omitempty && slices.Contains(required, f.name) {
				t.Errorf("schema %s: %s is required but omitted when empty", name, f.name)
			}
		}
		for p := range props {
			if !slices.ContainsFunc(fields, func(f field) bool { return f.name == p }) {
				t.Errorf("schema %s has property %s, which %v has not", name, p, g.typ)
			}
		}
	}
}

type field struct {
	name      string
	typ       reflect.Type
	omitempty bool
}

// jsonFields are the fields encoding/json writes for t, embedded structs'
// fields included.
func jsonFields(t reflect.Type) []field {
	var out []field
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, field{name, f.Type, slices.Contains(strings.Split(opts, ","), "omitempty")})
	}
	return out
}

// sameType says how schema p does not describe what Go encodes a t as; ""
// when it does. nullable: Go may write null (a nil t, no omitempty).
func sameType(schemas map[string]any, byType map[reflect.Type]string, p map[string]any, t reflect.Type, nullable bool) string {
	if ref, ok := p["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if want, ok := byType[t]; ok {
			if name != want {
				return "$ref " + name + "; want " + want + " for " + t.String()
			}
			return ""
		}
		p, _ = schemas[name].(map[string]any)
		if p == nil {
			return "$ref " + ref + " resolves to nothing"
		}
	}
	types := map[string]bool{}
	switch v := p["type"].(type) {
	case string:
		types[v] = true
	case []any:
		for _, x := range v {
			types[x.(string)] = true
		}
	}
	want := ""
	canNull := false
	switch t.Kind() {
	case reflect.String:
		want = "string"
	case reflect.Bool:
		want = "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "integer"
	case reflect.Float32, reflect.Float64:
		want = "number"
	case reflect.Pointer:
		// A pointer field with omitempty is absent when nil.
		if s := sameType(schemas, byType, p, t.Elem(), false); s != "" {
			return s
		}
		if nullable && !types["null"] {
			return t.String() + " without omitempty may be null"
		}
		return ""
	case reflect.Slice:
		want, canNull = "array", true
		if items, ok := p["items"].(map[string]any); !ok {
			return "an array without items"
		} else if s := sameType(schemas, byType, items, t.Elem(), false); s != "" {
			return "items: " + s
		}
	case reflect.Map:
		want, canNull = "object", true
		if ap, ok := p["additionalProperties"].(map[string]any); !ok {
			return "a map without an additionalProperties schema"
		} else if s := sameType(schemas, byType, ap, t.Elem(), false); s != "" {
			return "additionalProperties: " + s
		}
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			if !types["string"] || p["format"] != "date-time" {
				return "a time.Time: want string, format date-time"
			}
			return ""
		}
		if t.Implements(reflect.TypeFor[encoding.TextMarshaler]()) {
			want = "string" // written as its text: config.Duration, config.Size
			break
		}
		return t.String() + ": want a $ref to its schema"
	default:
		return "no JSON type for " + t.String()
	}
	if !types[want] {
		return "type " + jsonString(p["type"]) + " for a " + t.String() + "; want " + want
	}
	if canNull && nullable && !types["null"] {
		return "a " + t.String() + " without omitempty may be null; want type [" + want + ", null]"
	}
	if len(types) > 1 && !(len(types) == 2 && types["null"] && canNull) {
		return "type " + jsonString(p["type"]) + " for a " + t.String()
	}
	return ""
}

func asSlice(v any) []any { s, _ := v.([]any); return s }

func jsonString(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestOpenAPISchemasCompile: every schema the document has, and every
// response's, compiles as JSON Schema 2020-12, its $refs resolved.
func TestOpenAPISchemasCompile(t *testing.T) {
	d, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	doc := openapiDoc(t)
	for name := range doc["components"].(map[string]any)["schemas"].(map[string]any) {
		if _, err := d.Schema("/components/schemas/" + name); err != nil {
			t.Error(err)
		}
	}
	var walk func(ptr string, v any)
	walk = func(ptr string, v any) {
		o, ok := v.(map[string]any)
		if !ok {
			return
		}
		if strings.Contains(ptr, "/content/") && strings.HasSuffix(ptr, "/schema") {
			if _, err := d.Schema(ptr); err != nil {
				t.Error(err)
			}
			return
		}
		for k, x := range o {
			walk(ptr+"/"+strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1"), x)
		}
	}
	walk("", doc)
	if len(d.Operations()) < 10 {
		t.Errorf("operations %v", d.Operations())
	}
}

// TestOpenAPIFormats: the patterns of Size and Duration accept exactly
// what the config's parsers accept (and find above zero), on a table of
// both.
func TestOpenAPIFormats(t *testing.T) {
	d, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"65536", "256m", "256M", "1.5g", "64MiB", "2GB", "1t", "10kb", "7b", "0", "1k", "1.25m",
		"", "-1", "1.", ".5m", "1..2m", "m", "12x", "1 m", "1mm", "1e3", "0x10", "１m", "1kibb", strings.Repeat("9", 65)} {
		_, perr := config.ParseSize(s)
		verr := d.Validate("/components/schemas/Size", []byte(jsonString(s)))
		if (perr == nil) != (verr == nil) {
			t.Errorf("size %q: ParseSize error %v, schema error %v", s, perr, verr)
		}
	}
	for _, s := range []string{"5s", "1m30s", "500ms", "1.5h", "2us", "3µs", "1h2m3s4ms", ".5s", "1.s", "10ns",
		"", "5", "-5s", "0s", "s", "1d", "5 s", "+5s", "1s-", "5S"} {
		n, perr := config.ParseDuration(s)
		verr := d.Validate("/components/schemas/Duration", []byte(jsonString(s)))
		if s == "0s" {
			// Zero parses but is refused: the pattern has no minimum.
			if perr == nil || verr != nil {
				t.Errorf("duration 0s: parsed %v %v; schema %v", n, perr, verr)
			}
			continue
		}
		if (perr == nil) != (verr == nil) {
			t.Errorf("duration %q: ParseDuration error %v, schema error %v", s, perr, verr)
		}
	}
}

// TestOpenAPIServed: GET /v1/openapi.json answers the document behind the
// token, and the answers of the server's own refusals (no token, no such
// path, a method the path does not take) are what the document says.
func TestOpenAPIServed(t *testing.T) {
	d, err := openapitest.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Server.Token = "t0ken"
	run := func(_ context.Context, p *task.Plan, _ runapi.Hooks) *result.Result {
		return &result.Result{ID: "ar-1"}
	}
	ts := httptest.NewServer(server.New(cfg, run, nil).Handler())
	defer ts.Close()
	do := func(method, path, auth string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if err := d.Check(method, path, resp.StatusCode, resp.Header, b); err != nil {
			t.Error(err)
		}
		return resp.StatusCode, b
	}
	const right = "Bearer t0ken"
	if code, b := do("GET", "/v1/openapi.json", right); code != 200 || string(b) != string(server.OpenAPI) {
		t.Errorf("GET /v1/openapi.json: %d, %d bytes; want 200 and the document", code, len(b))
	}
	for _, c := range []struct {
		method, path string
		auth         string
		want         int
	}{
		{"GET", "/v1/openapi.json", "", 401},
		{"GET", "/healthz", right, 200},
		{"HEAD", "/healthz", right, 200},
		{"GET", "/v1/nothing", right, 404},
		{"POST", "/v1/openapi.json", right, 405},
		{"PUT", "/v1/runs", right, 405},
	} {
		if code, b := do(c.method, c.path, c.auth); code != c.want {
			t.Errorf("%s %s: %d %s; want %d", c.method, c.path, code, b, c.want)
		}
	}
	// A foreign Host, and a foreign Origin, on paths the document lists.
	for _, c := range []struct{ method, path, host, origin string }{
		{"GET", "/healthz", "evil.example", ""},
		{"POST", "/v1/runs", "evil.example", "http://evil.example"},
		{"GET", "/metrics", "", "http://evil.example"},
		{"POST", "/v1/runs", "", "http://evil.example"},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		req.Header.Set("Authorization", right)
		if c.host != "" {
			req.Host = c.host
		}
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := map[bool]int{true: 421, false: 403}[c.host != ""]
		if resp.StatusCode != want {
			t.Errorf("%s %s with Host %q, Origin %q: %d; want %d", c.method, c.path, c.host, c.origin, resp.StatusCode, want)
		}
		if err := d.Check(c.method, c.path, resp.StatusCode, resp.Header, b); err != nil {
			t.Error(err)
		}
	}
	// Wrong tokens, until this address is refused without comparing.
	code := 401
	for i := 0; code == 401 && i < 100; i++ {
		code, _ = do("GET", "/healthz", "Bearer wrong")
	}
	if code != 429 {
		t.Errorf("wrong tokens: %d; want 429 in the end", code)
	}
	if !d.Seen("GET /v1/openapi.json", "401") || !d.Seen("GET /healthz", "200") || !d.Seen("GET /healthz", "429") ||
		!d.Seen("GET /healthz", "421") || !d.Seen("GET /metrics", "403") {
		t.Error("answers not recorded as seen")
	}
}
