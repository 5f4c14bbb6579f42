package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentrun/agentrun/internal/approvals"
	"github.com/agentrun/agentrun/internal/metrics"
)

// The approvals page (server.approvals.page): GET /ui/approvals lists the
// requests held for a decision with Approve and Deny buttons and the last
// decisions, refreshed from /ui/approvals.json. It takes the API's token
// as a bearer header, or through its login form, which sets a session
// cookie (HttpOnly, SameSite=Strict); a decision posted with the cookie
// carries the session's CSRF token. The program's text (method, URL,
// body of a request; tool and arguments of a held tool call, shown with
// its tool server instead) is shown as text only: html/template escapes
// it on the server, and the script sets it as textContent, never as
// markup. A strict Content-Security-Policy allows no inline script at all.

//go:embed ui
var uiFiles embed.FS

// The page's paths; the API's bearer check leaves them to the page, which
// also takes its cookie.
const (
	uiPage   = "/ui/approvals"
	uiJSON   = "/ui/approvals.json"
	uiScript = "/ui/approvals.js"
	uiStyle  = "/ui/approvals.css"
	uiLogin  = "/ui/login"
	uiDecide = "/ui/decide"
)

func isUIPath(p string) bool {
	switch p {
	case uiPage, uiJSON, uiScript, uiStyle, uiLogin, uiDecide:
		return true
	}
	return false
}

const (
	uiCookie      = "agentrun_ui"
	uiSessionTTL  = 12 * time.Hour
	maxUISessions = 256
	csrfHeader    = "X-CSRF-Token"
)

// uiSessions are the page's logged-in sessions: a random id (the cookie's
// value, never the token) -> when it ends and which token it logged in
// with (a session ends with its token).
type uiSessions struct {
	mu       sync.Mutex
	sessions map[string]uiSession
	key      []byte // CSRF tokens' HMAC key, made at first use
	tmpl     *template.Template
}

type uiSession struct {
	expires time.Time
	token   [32]byte // SHA-256 of the token it logged in with
}

func (u *uiSessions) init() {
	if u.sessions == nil {
		u.sessions = map[string]uiSession{}
		u.key = make([]byte, 32)
		rand.Read(u.key)
		u.tmpl = template.Must(template.ParseFS(uiFiles, "ui/*.html"))
	}
}

// create makes a session for token and returns its id.
func (u *uiSessions) create(token string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.init()
	now := time.Now()
	for id, s := range u.sessions {
		if now.After(s.expires) {
			delete(u.sessions, id)
		}
	}
	for len(u.sessions) >= maxUISessions {
		oldest := ""
		for id, s := range u.sessions {
			if oldest == "" || s.expires.Before(u.sessions[oldest].expires) {
				oldest = id
			}
		}
		delete(u.sessions, oldest)
	}
	var b [32]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	u.sessions[id] = uiSession{expires: now.Add(uiSessionTTL), token: sha256.Sum256([]byte(token))}
	return id
}

// valid says whether id is a live session of token.
func (u *uiSessions) valid(id, token string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	s, ok := u.sessions[id]
	if !ok || time.Now().After(s.expires) {
		return false
	}
	want := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(s.token[:], want[:]) == 1
}

// csrf is the CSRF token of session id.
func (u *uiSessions) csrf(id string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.init()
	m := hmac.New(sha256.New, u.key)
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

func (u *uiSessions) template() *template.Template {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.init()
	return u.tmpl
}

func (s *Server) routeUI(mux *http.ServeMux) {
	mux.HandleFunc(uiPage, only(s.uiPage, http.MethodGet, http.MethodHead))
	mux.HandleFunc(uiJSON, only(s.uiList, http.MethodGet))
	mux.HandleFunc(uiScript, only(s.uiStatic("approvals.js", "text/javascript; charset=utf-8"), http.MethodGet, http.MethodHead))
	mux.HandleFunc(uiStyle, only(s.uiStatic("approvals.css", "text/css; charset=utf-8"), http.MethodGet, http.MethodHead))
	mux.HandleFunc(uiLogin, only(s.uiLogin, http.MethodPost))
	mux.HandleFunc(uiDecide, only(s.uiDecide, http.MethodPost))
}

// uiAuth is how r is authenticated: by the bearer token (or none being
// configured), or by the session of its cookie (sid). ok false: neither.
// wait > 0: r carries a bearer header and its source has no guess left
// (see guesses); r is then neither, whatever its cookie.
func (s *Server) uiAuth(r *http.Request) (sid string, bearer, ok bool, wait time.Duration) {
	token := s.cfg.Load().Server.Token
	if token == "" {
		bearer = true
	} else if bearer, wait = s.bearer(r, token); wait > 0 {
		return "", false, false, wait
	}
	if c, err := r.Cookie(uiCookie); err == nil && s.ui.valid(c.Value, token) {
		sid = c.Value
	}
	return sid, bearer, bearer || sid != "", 0
}

// uiHeaders are every page answer's: no caching, no framing, no script
// but the page's own file, no referrer sent to another origin. The
// page's own requests keep theirs: under "no-referrer" a browser sends
// its form's and its script's POSTs with "Origin: null", which serve
// refuses as a foreign origin (refuseForeignHost).
func uiHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
}

// uiEnabled answers 404 when the page is off.
func (s *Server) uiEnabled(w http.ResponseWriter) bool {
	if !s.cfg.Load().Server.Approvals.Page {
		writeError(w, http.StatusNotFound, "", "the approvals page is off (server.approvals.page)")
		return false
	}
	uiHeaders(w)
	return true
}

func (s *Server) setUICookie(w http.ResponseWriter, r *http.Request, sid string) {
	http.SetCookie(w, &http.Cookie{Name: uiCookie, Value: sid, Path: "/ui/", MaxAge: int(uiSessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func (s *Server) uiPage(w http.ResponseWriter, r *http.Request) {
	if !s.uiEnabled(w) {
		return
	}
	sid, bearer, ok, wait := s.uiAuth(r)
	if wait > 0 {
		s.uiTooManyGuesses(w, wait)
		return
	}
	if !ok {
		s.uiRender(w, http.StatusOK, "login.html", map[string]string{})
		return
	}
	if sid == "" && bearer {
		// A session for the page's own requests, which a browser makes
		// without the header.
		sid = s.ui.create(s.cfg.Load().Server.Token)
		s.setUICookie(w, r, sid)
	}
	s.uiRender(w, http.StatusOK, "approvals.html", map[string]string{"CSRF": s.ui.csrf(sid)})
}

func (s *Server) uiRender(w http.ResponseWriter, status int, name string, data any) {
	var b strings.Builder
	if err := s.ui.template().ExecuteTemplate(&b, name, data); err != nil {
		writeError(w, http.StatusInternalServerError, "", "rendering the page failed")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_ = writeBounded(w, []byte(b.String()))
}

func (s *Server) uiStatic(name, ctype string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.uiEnabled(w) {
			return
		}
		b, err := uiFiles.ReadFile("ui/" + name)
		if err != nil {
			writeError(w, http.StatusNotFound, "", "no such file")
			return
		}
		w.Header().Set("Content-Type", ctype)
		_ = writeBounded(w, b)
	}
}

// uiLogin takes the token from the login form and sets the session cookie.
func (s *Server) uiLogin(w http.ResponseWriter, r *http.Request) {
	if !s.uiEnabled(w) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	token := s.cfg.Load().Server.Token
	got := r.PostFormValue("token")
	ok := got == token // with no token set, an empty field
	if token != "" {
		var wait time.Duration
		if ok, wait = s.checkToken(r, got, token); wait > 0 {
			s.uiTooManyGuesses(w, wait)
			return
		}
	}
	if !ok {
		s.uiRender(w, http.StatusUnauthorized, "login.html", map[string]string{"Error": "Wrong token."})
		return
	}
	s.setUICookie(w, r, s.ui.create(token))
	http.Redirect(w, r, uiPage, http.StatusSeeOther)
}

// uiTooManyGuesses answers 429 with the login form and why.
func (s *Server) uiTooManyGuesses(w http.ResponseWriter, wait time.Duration) {
	s.refuseGuess(w, wait)
	s.uiRender(w, http.StatusTooManyRequests, "login.html", map[string]string{"Error": guessMessage(wait)})
}

// uiHeld is a held request as the page gets it: the hold and the
// milliseconds left at the answer (the browser's clock may differ).
type uiHeld struct {
	approvals.Hold
	LeftMS int64 `json:"left_ms"`
}

// UIList is the body of GET /ui/approvals.json.
type UIList struct {
	Held   []uiHeld            `json:"held"`
	Recent []approvals.Decided `json:"recent"`
}

func (s *Server) uiList(w http.ResponseWriter, r *http.Request) {
	if !s.uiEnabled(w) {
		return
	}
	if _, _, ok, wait := s.uiAuth(r); wait > 0 {
		s.tooManyGuesses(w, wait)
		return
	} else if !ok {
		writeError(w, http.StatusUnauthorized, "", "log in at "+uiPage)
		return
	}
	hs, recent := s.holds.List()
	l := UIList{Held: make([]uiHeld, 0, len(hs)), Recent: recent}
	now := time.Now()
	for _, h := range hs {
		l.Held = append(l.Held, uiHeld{Hold: h, LeftMS: max(0, h.ExpiresAt.Sub(now).Milliseconds())})
	}
	if l.Recent == nil {
		l.Recent = []approvals.Decided{}
	}
	writeJSON(w, http.StatusOK, l)
}

// uiDecide is the page's Approve or Deny: form fields run, id, approve
// (true or false), and with a cookie session its CSRF token (field csrf
// or header X-CSRF-Token).
func (s *Server) uiDecide(w http.ResponseWriter, r *http.Request) {
	if !s.uiEnabled(w) {
		return
	}
	sid, bearer, ok, wait := s.uiAuth(r)
	if wait > 0 {
		s.tooManyGuesses(w, wait)
		return
	}
	if !ok {
		writeError(w, http.StatusUnauthorized, "", "log in at "+uiPage)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "", "want a form: run, id, approve")
		return
	}
	// Only a bearer header a client sent itself spares the CSRF token
	// (a browser never sends one on its own); without a token set,
	// every request is "bearer", and another site's form would be too.
	if !bearer || r.Header.Get("Authorization") == "" {
		got := r.Header.Get(csrfHeader)
		if got == "" {
			got = r.PostForm.Get("csrf")
		}
		if subtle.ConstantTimeCompare([]byte(got), []byte(s.ui.csrf(sid))) != 1 {
			writeError(w, http.StatusForbidden, "csrf", "missing or wrong CSRF token: reload the page")
			return
		}
	}
	run, id := r.PostForm.Get("run"), r.PostForm.Get("id")
	var approve bool
	switch r.PostForm.Get("approve") {
	case "true":
		approve = true
	case "false":
	default:
		writeError(w, http.StatusBadRequest, "approve", "approve: want true or false")
		return
	}
	if !s.holds.Decide(run, id, approve, approvals.Operator(approvals.ViaPage, ""), metrics.ChannelPage) {
		writeError(w, http.StatusNotFound, "", fmt.Sprintf("no approval %q of run %q is waiting: it was decided, timed out, or its request ended", id, run))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"run": run, "id": id, "approved": approve})
}
