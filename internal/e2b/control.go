package e2b

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
	"github.com/agentrun/agentrun/internal/task"
)

// The control API as E2B's SDKs call it (E2B's spec/openapi.yml), paths
// under /e2b.

// Bounds of what a control call sends.
const (
	maxControlBody   = 256 << 10
	maxMetadata      = 64
	maxMetadataKey   = 128
	maxMetadataValue = 1024
	maxListLimit     = 100
)

// EnvdVersion is the envd version the door answers: the SDKs enable
// what versions up to it have (closeStdin from 0.5.2, octet-stream
// uploads from 0.5.7).
const EnvdVersion = "0.5.7"

// clientID is what the door answers for E2B's clientID, which the
// schema requires.
const clientID = "agentrun"

// refusedMemory is why pause, resume, snapshots and forks are refused.
const refusedMemory = "agentrun never keeps a sandbox's memory (pause, resume, snapshots and forks keep it): a sandbox lives until its timeout or kill, and ends whole"

func (h *Handler) routeControl(mux *http.ServeMux) {
	mux.HandleFunc("POST /sandboxes", h.create)
	mux.HandleFunc("POST /v2/sandboxes", h.create)
	mux.HandleFunc("GET /sandboxes", h.listV1)
	mux.HandleFunc("GET /v2/sandboxes", h.listV2)
	mux.HandleFunc("GET /sandboxes/{id}", h.withSandbox(h.get))
	mux.HandleFunc("DELETE /sandboxes/{id}", h.withSandbox(h.kill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", h.withSandbox(h.setTimeout))
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", h.withSandbox(h.refresh))
	mux.HandleFunc("POST /sandboxes/{id}/connect", h.withSandbox(h.connect))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", h.withSandbox(h.connect))
	for _, p := range []string{"POST /sandboxes/{id}/pause", "POST /sandboxes/{id}/resume",
		"POST /sandboxes/{id}/snapshots", "POST /sandboxes/{id}/fork", "GET /snapshots"} {
		mux.HandleFunc(p, refuse(http.StatusBadRequest, refusedMemory))
	}
	mux.HandleFunc("PUT /sandboxes/{id}/network", refuse(http.StatusBadRequest,
		"agentrun sets a sandbox's network when it is created (network.allowOut) and never changes it after"))
	for _, p := range []string{"GET /sandboxes/{id}/metrics", "GET /sandboxes/metrics", "GET /sandboxes/{id}/logs", "GET /v2/sandboxes/{id}/logs"} {
		mux.HandleFunc(p, refuse(http.StatusBadRequest, "agentrun does not serve E2B's metrics and logs: its own are serve's /metrics and the audit log"))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not an endpoint of agentrun's E2B API (docs/e2b.md)", r.Method, r.URL.Path))
	})
}

func refuse(status int, msg string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) { WriteError(w, status, msg) }
}

// withSandbox answers 404 for an id that is none of the key's, as E2B
// does, else calls h with the sandbox.
func (h *Handler) withSandbox(next func(http.ResponseWriter, *http.Request, *record, runapi.Sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		rec, sb := h.userSandbox(userFrom(r), id)
		if rec == nil {
			WriteError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
			return
		}
		next(w, r, rec, sb)
	}
}

// readBody decodes r's JSON body, at most maxControlBody bytes, into v;
// fields it does not know are left (the SDKs add fields as E2B grows). An
// empty body is {}.
func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxControlBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, errEOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is more than the %d bytes this endpoint takes", maxControlBody))
		} else {
			WriteError(w, http.StatusBadRequest, "the body is not the JSON expected: "+err.Error())
		}
		return false
	}
	return true
}

// newSandbox is E2B's NewSandbox body.
type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"` // seconds
	AutoPause           *bool                   `json:"autoPause"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *struct {
		AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
		AllowOut           []string        `json:"allowOut"`
		DenyOut            []string        `json:"denyOut"`
		MaskRequestHost    *string         `json:"maskRequestHost"`
		Rules              json.RawMessage `json:"rules"`
		EgressProxy        json.RawMessage `json:"egressProxy"`
	} `json:"network"`
	Metadata     map[string]string `json:"metadata"`
	EnvVars      map[string]string `json:"envVars"`
	MCP          json.RawMessage   `json:"mcp"`
	VolumeMounts json.RawMessage   `json:"volumeMounts"`
	IAM          json.RawMessage   `json:"iam"`
}

// present says whether a raw JSON field was given as something.
func present(m json.RawMessage) bool {
	s := strings.TrimSpace(string(m))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

// sandboxRequest is body as a live sandbox's request, or why not.
func (body *newSandbox) sandboxRequest(cfg *config.Config) (*runapi.SandboxRequest, string) {
	tpl := body.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	img, ok := cfg.E2B.Templates[tpl]
	if !ok {
		names := make([]string, 0, len(cfg.E2B.Templates))
		for n := range cfg.E2B.Templates {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Sprintf("template %q is not one of this server's (e2b.templates: %s)", tpl, strings.Join(names, ", "))
	}
	switch {
	case body.AutoPause != nil && *body.AutoPause, body.AutoResume != nil && body.AutoResume.Enabled:
		return nil, "autoPause and autoResume: " + refusedMemory
	case present(body.MCP):
		return nil, "mcp: agentrun does not start E2B's MCP gateway in a sandbox"
	case present(body.VolumeMounts):
		return nil, "volumeMounts: agentrun has no E2B volumes"
	case present(body.IAM):
		return nil, "iam: agentrun gives a sandbox no cloud identity tokens"
	case body.AllowInternetAccess != nil && *body.AllowInternetAccess:
		return nil, "allow_internet_access: an agentrun sandbox reaches only the hosts network.allowOut names (through its proxy), never the whole internet; leave it out or false"
	}
	if len(body.Metadata) > maxMetadata {
		return nil, fmt.Sprintf("metadata: %d entries, at most %d", len(body.Metadata), maxMetadata)
	}
	for k, v := range body.Metadata {
		if k == "" || len(k) > maxMetadataKey || len(v) > maxMetadataValue {
			return nil, fmt.Sprintf("metadata: each key 1 to %d bytes and each value at most %d", maxMetadataKey, maxMetadataValue)
		}
	}
	req := &runapi.SandboxRequest{Image: img, Env: body.EnvVars}
	if n := body.Network; n != nil {
		switch {
		case n.MaskRequestHost != nil && *n.MaskRequestHost != "":
			return nil, "network.maskRequestHost: agentrun forwards a port's requests with the Host the sandbox's own server expects"
		case present(n.Rules), present(n.EgressProxy):
			return nil, "network.rules and network.egressProxy: agentrun's allowlist has no per-host rules here; name the hosts in network.allowOut (the config's network.services inject credentials)"
		}
		for _, a := range n.AllowOut {
			if isAddress(a) {
				return nil, fmt.Sprintf("network.allowOut: %q is an address or range; agentrun's allowlist takes host names (%q, \"*.example.com\", with an optional :port)", a, "pypi.org")
			}
		}
		// Everything not allowed is denied: each denyOut entry holds.
		req.Network = task.Network{Allow: n.AllowOut}
	}
	if body.Timeout != nil && *body.Timeout > 0 {
		req.Timeout = seconds(*body.Timeout)
	}
	return req, ""
}

// isAddress says whether an allowOut entry is an IP address or range
// (E2B takes those; agentrun's allowlist names hosts).
func isAddress(s string) bool {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") || strings.Contains(s, ":") && strings.Count(s, ":") > 1 {
		return true
	}
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		host = s[:i]
	}
	return host != "" && strings.Trim(host, "0123456789.") == ""
}

// seconds is n seconds as a config duration, at most a day's worth
// (beyond any max lifetime, so refused as past it).
func seconds(n int64) config.Duration {
	n = min(n, int64(config.MaxSandboxLifetime/time.Second)+1)
	var d config.Duration
	_ = d.UnmarshalText([]byte(strconv.FormatInt(n, 10) + "s")) // always a duration
	return d
}

// sandboxJSON is E2B's Sandbox (create's and connect's answer).
type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

func (rec *record) sandboxJSON(domain string) sandboxJSON {
	sb := sandboxJSON{TemplateID: rec.template, SandboxID: rec.id, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: rec.envdToken, TrafficAccessToken: rec.trafficToken}
	if domain != "" {
		sb.Domain = &domain
	}
	return sb
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var body newSandbox
	if !readBody(w, r, &body) {
		return
	}
	cfg := h.cfg.Load()
	req, why := body.sandboxRequest(cfg)
	if why != "" {
		WriteError(w, http.StatusBadRequest, why)
		return
	}
	plan, lifetime, err := runapi.SandboxPlan(req, cfg)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	user := userFrom(r)
	h.prune()
	sb, err := h.sandboxes.Create(r.Context(), plan, user, lifetime, cfg.Sandboxes.MaxLifetime.Duration())
	if err != nil {
		writeRefusal(w, err)
		return
	}
	info := sb.Info()
	tpl := body.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	rec := &record{id: info.ID, user: user, template: tpl, metadata: body.Metadata,
		envdToken: newToken(), trafficToken: newToken(), started: info.Created,
		cpus: int(math.Ceil(plan.Limits.CPUs)), memoryMB: int(plan.Limits.Memory >> 20)}
	if body.Network != nil {
		rec.allowOut, rec.denyOut = body.Network.AllowOut, body.Network.DenyOut
	}
	h.mu.Lock()
	h.records[info.ID] = rec
	h.mu.Unlock()
	writeJSON(w, http.StatusCreated, rec.sandboxJSON(cfg.E2B.Domain))
}

// writeRefusal answers a live sandbox's refusal by its kind: past
// sandboxes.max 429 with Retry-After, as E2B's rate limit.
func writeRefusal(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, runapi.ErrTooManySandboxes), errkind.Of(err) == errkind.Quota:
		writeRetry(w, 5*time.Second, err.Error())
		return
	case errors.Is(err, runapi.ErrSandboxesClosed):
		WriteError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	status := http.StatusInternalServerError
	switch errkind.Of(err) {
	case errkind.Invalid, errkind.Policy, errkind.Unusable:
		status = http.StatusBadRequest
	case errkind.NotFound:
		status = http.StatusNotFound
	case errkind.Busy, errkind.Unavailable:
		writeRetry(w, time.Second, err.Error())
		return
	case errkind.TooLarge:
		status = http.StatusRequestEntityTooLarge
	case errkind.Full:
		status = http.StatusInsufficientStorage
	}
	WriteError(w, status, err.Error())
}

// detailJSON is E2B's SandboxDetail (get) and, less the tokens,
// ListedSandbox (list).
type detailJSON struct {
	TemplateID          string            `json:"templateID"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	Domain              *string           `json:"domain"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Network             *networkJSON      `json:"network,omitempty"`
	Lifecycle           *lifecycleJSON    `json:"lifecycle,omitempty"`
	VolumeMounts        []struct{}        `json:"volumeMounts"`
}

type networkJSON struct {
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

func (rec *record) detail(sb runapi.Sandbox, full bool) detailJSON {
	d := detailJSON{TemplateID: rec.template, SandboxID: rec.id, ClientID: clientID, StartedAt: rec.started,
		EndAt: sb.Info().ExpiresAt, EnvdVersion: EnvdVersion, CPUCount: max(rec.cpus, 1), MemoryMB: rec.memoryMB,
		Metadata: rec.metadata, State: "running", VolumeMounts: []struct{}{}}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	if full {
		no := false
		d.EnvdAccessToken, d.AllowInternetAccess = rec.envdToken, &no
		d.Network = &networkJSON{AllowOut: nonNil(rec.allowOut), DenyOut: nonNil(rec.denyOut)}
		d.Lifecycle = &lifecycleJSON{OnTimeout: "kill"}
	}
	return d
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (h *Handler) get(w http.ResponseWriter, _ *http.Request, rec *record, sb runapi.Sandbox) {
	d := rec.detail(sb, true)
	if dom := h.cfg.Load().E2B.Domain; dom != "" {
		d.Domain = &dom
	}
	writeJSON(w, http.StatusOK, d)
}

func (h *Handler) kill(w http.ResponseWriter, _ *http.Request, rec *record, sb runapi.Sandbox) {
	err := sb.Close()
	h.forget(rec.id)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, "the sandbox ended, but its tear-down failed: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// setTimeout makes the sandbox end timeout seconds from now.
func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, _ *record, sb runapi.Sandbox) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if !readBody(w, r, &body) {
		return
	}
	if body.Timeout == nil || *body.Timeout < 0 {
		WriteError(w, http.StatusBadRequest, "timeout: a number of seconds is required")
		return
	}
	if _, err := sb.SetTimeout(seconds(*body.Timeout).Duration()); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh keeps the sandbox alive duration seconds (E2B's keep-alive):
// it never shortens its life.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, _ *record, sb runapi.Sandbox) {
	var body struct {
		Duration int64 `json:"duration"`
	}
	if !readBody(w, r, &body) {
		return
	}
	if err := extend(sb, body.Duration); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend makes sb end n seconds from now if that is later than its end.
func extend(sb runapi.Sandbox, n int64) error {
	if n <= 0 {
		return nil
	}
	d := seconds(n).Duration()
	if time.Now().Add(d).Before(sb.Info().ExpiresAt) {
		return nil
	}
	_, err := sb.SetTimeout(d)
	return err
}

// connect answers the sandbox's tokens, its life made at least timeout
// seconds from now; a live sandbox is never paused, so never resumed.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, rec *record, sb runapi.Sandbox) {
	var body struct {
		Timeout int64 `json:"timeout"`
		Memory  *bool `json:"memory"`
	}
	if !readBody(w, r, &body) {
		return
	}
	if err := extend(sb, body.Timeout); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, rec.sandboxJSON(h.cfg.Load().E2B.Domain))
}

// listed is the key's sandboxes whose metadata has every pair of r's
// metadata filter, oldest first.
func (h *Handler) listed(w http.ResponseWriter, r *http.Request) ([]detailJSON, bool) {
	q := r.URL.Query()
	want, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		WriteError(w, http.StatusBadRequest, "metadata: "+err.Error())
		return nil, false
	}
	if states := q.Get("state"); states != "" && !slices.Contains(strings.Split(states, ","), "running") {
		return []detailJSON{}, true // none is ever paused
	}
	user := userFrom(r)
	h.prune()
	h.mu.Lock()
	var recs []*record
	for _, rec := range h.records {
		if rec.user == user {
			recs = append(recs, rec)
		}
	}
	h.mu.Unlock()
	list := []detailJSON{}
	for _, rec := range recs {
		sb := h.sandboxes.Get(user, rec.id)
		if sb == nil || !matches(rec.metadata, want) {
			continue
		}
		list = append(list, rec.detail(sb, false))
	}
	slices.SortFunc(list, func(a, b detailJSON) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.SandboxID, b.SandboxID)
	})
	return list, true
}

// metadataFilter reads the metadata query parameter: key=value pairs
// joined by & (each key and value escaped once more by the SDK).
func metadataFilter(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) > maxMetadata*(maxMetadataKey+maxMetadataValue)*3 {
		return nil, errors.New("the filter is too long")
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, err
	}
	want := map[string]string{}
	for k, v := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v[len(v)-1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%q is not escaped as the SDK escapes it", k)
		}
		want[key] = val
	}
	return want, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// listV1 is GET /sandboxes: every one, no pages.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request) {
	if list, ok := h.listed(w, r); ok {
		writeJSON(w, http.StatusOK, list)
	}
}

// listV2 is GET /v2/sandboxes: a page of at most limit (100 at most),
// from after nextToken; the next page's token in X-Next-Token.
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request) {
	list, ok := h.listed(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := maxListLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxListLimit {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("limit: 1 to %d", maxListLimit))
			return
		}
		limit = n
	}
	if tok := q.Get("nextToken"); tok != "" {
		after, id, err := readPageToken(tok)
		if err != nil {
			WriteError(w, http.StatusBadRequest, "nextToken: "+err.Error())
			return
		}
		i, _ := slices.BinarySearchFunc(list, struct{}{}, func(d detailJSON, _ struct{}) int {
			if c := d.StartedAt.Compare(after); c != 0 {
				return c
			}
			if d.SandboxID <= id {
				return -1
			}
			return 1
		})
		list = list[i:]
	}
	if len(list) > limit {
		last := list[limit-1]
		w.Header().Set("X-Next-Token", pageToken(last.StartedAt, last.SandboxID))
		list = list[:limit]
	}
	writeJSON(w, http.StatusOK, list)
}

// pageToken is the place after a sandbox started at t with id.
func pageToken(t time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(t.UTC().Format(time.RFC3339Nano) + " " + id))
}

func readPageToken(tok string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) > 256 {
		return time.Time{}, "", errors.New("not a token this server gave")
	}
	ts, id, ok := strings.Cut(string(b), " ")
	t, err := time.Parse(time.RFC3339Nano, ts)
	if !ok || err != nil {
		return time.Time{}, "", errors.New("not a token this server gave")
	}
	return t, id, nil
}
