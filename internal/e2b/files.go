package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/runapi"
)

// Bounds of envd's /files.
const (
	// MaxFileBytes bounds one file read or written.
	MaxFileBytes = 16 << 20
	// MaxUploadFiles bounds the files of one upload.
	MaxUploadFiles = 100
	// maxUploadBody bounds a multipart upload's body, its parts' headers
	// included.
	maxUploadBody = 64 << 20
)

// fileSlots bounds the files the door holds in memory at once, 16 MiB
// at most each: a download's, and an upload's whose size is known once
// read (a multipart part, a gzip'd or chunked body); the others wait
// their turn.
var fileSlots = make(chan struct{}, 4)

// takeSlot waits for one of fileSlots, or ctx's end; release gives it
// back.
func takeSlot(ctx context.Context) (release func(), err error) {
	select {
	case fileSlots <- struct{}{}:
		return func() { <-fileSlots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// entryJSON is a file /files wrote, as envd answers it.
type entryJSON struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// download answers GET /files?path=P: the sandbox's regular file, never
// through a link.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	c := CallOf(r.Context())
	if c == nil {
		WriteError(w, http.StatusInternalServerError, "not a call into a sandbox")
		return
	}
	name := r.URL.Query().Get("path")
	if name == "" {
		WriteError(w, http.StatusBadRequest, "a download names its file in ?path=")
		return
	}
	release, err := takeSlot(r.Context())
	if err != nil {
		WriteError(w, http.StatusBadRequest, "the client left")
		return
	}
	defer release()
	data, err := c.Sandbox.ReadFile(sandboxPath(name), MaxFileBytes)
	if err != nil {
		writeFileError(w, name, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(name)}))
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
}

// upload answers POST /files: multipart/form-data (each part a "file",
// written at ?path= when given, else at its file name, the SDK's
// multi-file write) or application/octet-stream (the body, at ?path=,
// gzip'd when its Content-Encoding says so). Each file replaces what was
// there (a link never written through), its missing parents made.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	c := CallOf(r.Context())
	if c == nil {
		WriteError(w, http.StatusInternalServerError, "not a call into a sandbox")
		return
	}
	dest := r.URL.Query().Get("path")
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var written []entryJSON
	var err error
	switch ct {
	case "multipart/form-data":
		written, err = uploadParts(r, c.Sandbox, dest)
	case "application/octet-stream":
		if dest == "" {
			WriteError(w, http.StatusBadRequest, "an application/octet-stream upload names its file in ?path=")
			return
		}
		var e entryJSON
		e, err = uploadBody(r, c.Sandbox, dest)
		written = []entryJSON{e}
	default:
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("an upload is multipart/form-data or application/octet-stream, not %q", ct))
		return
	}
	if err != nil {
		writeFileError(w, dest, err)
		return
	}
	writeJSON(w, http.StatusOK, written)
}

// uploadParts writes a multipart upload's files.
func uploadParts(r *http.Request, sb runapi.Sandbox, dest string) ([]entryJSON, error) {
	r.Body = http.MaxBytesReader(nil, r.Body, maxUploadBody)
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, errkind.Mark(errkind.Invalid, fmt.Errorf("the upload's body: %w", err))
	}
	var out []entryJSON
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, errkind.Mark(errkind.Invalid, fmt.Errorf("the upload's body: %w", err))
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		if len(out) >= MaxUploadFiles {
			return out, errkind.Mark(errkind.TooLarge, fmt.Errorf("an upload holds at most %d files", MaxUploadFiles))
		}
		name := dest
		if name == "" || len(out) > 0 {
			// The part's file name as sent: the SDK's path of each file
			// (Part.FileName keeps its last element alone).
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			name = params["filename"]
		}
		if name == "" {
			return out, errkind.Mark(errkind.Invalid, errors.New("a file of the upload has no path: give ?path= or the part's file name"))
		}
		e, err := writeBuffered(r.Context(), sb, name, part)
		part.Close()
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, errkind.Mark(errkind.Invalid, errors.New("the upload holds no \"file\" part"))
	}
	return out, nil
}

// uploadBody writes an application/octet-stream upload's body at dest:
// straight from the body when its length is known, else held first.
func uploadBody(r *http.Request, sb runapi.Sandbox, dest string) (entryJSON, error) {
	var body io.Reader = r.Body
	switch r.Header.Get("Content-Encoding") {
	case "", "identity":
		if r.ContentLength >= 0 {
			if r.ContentLength > MaxFileBytes {
				return entryJSON{}, tooLarge(dest)
			}
			if err := sb.WriteFile(sandboxPath(dest), r.Body, r.ContentLength); err != nil {
				return entryJSON{}, err
			}
			return entryOfWritten(sb, dest)
		}
	case "gzip":
		zr, err := gzip.NewReader(io.LimitReader(r.Body, maxUploadBody))
		if err != nil {
			return entryJSON{}, errkind.Mark(errkind.Invalid, fmt.Errorf("the upload's gzip: %w", err))
		}
		defer zr.Close()
		body = zr
	default:
		return entryJSON{}, errkind.Mark(errkind.Invalid, fmt.Errorf("Content-Encoding %q: gzip alone is taken", r.Header.Get("Content-Encoding")))
	}
	return writeBuffered(r.Context(), sb, dest, body)
}

// writeBuffered writes name from what r holds (at most MaxFileBytes),
// read into memory first within uploadSlots.
func writeBuffered(ctx context.Context, sb runapi.Sandbox, name string, r io.Reader) (entryJSON, error) {
	release, err := takeSlot(ctx)
	if err != nil {
		return entryJSON{}, err
	}
	defer release()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return entryJSON{}, errkind.Mark(errkind.TooLarge, fmt.Errorf("an upload's body is at most %d bytes", maxUploadBody))
		}
		return entryJSON{}, errkind.Mark(errkind.Invalid, fmt.Errorf("reading %q: %w", name, err))
	}
	if n > MaxFileBytes {
		return entryJSON{}, tooLarge(name)
	}
	if err := sb.WriteFile(sandboxPath(name), &buf, n); err != nil {
		return entryJSON{}, err
	}
	return entryOfWritten(sb, name)
}

func tooLarge(name string) error {
	return errkind.Mark(errkind.TooLarge, fmt.Errorf("%q: a file is at most %d bytes", name, MaxFileBytes))
}

// entryOfWritten is the file name, just written, as envd answers it.
func entryOfWritten(sb runapi.Sandbox, name string) (entryJSON, error) {
	fi, err := sb.Stat(sandboxPath(name))
	if err != nil {
		return entryJSON{}, err
	}
	return entryJSON{Name: fi.Name, Type: "file", Path: fi.Path}, nil
}

// writeFileError answers a /files error as envd does, in E2B's error
// shape: none there 404 (the SDK's FileNotFoundError), no room 507 (its
// NotEnoughSpaceError), past a bound 413, a path or a kind of file it
// cannot take 400, the sandbox gone 502.
func writeFileError(w http.ResponseWriter, name string, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, fs.ErrNotExist):
		status = http.StatusNotFound
	case errkind.Of(err) == errkind.TooLarge && strings.Contains(err.Error(), "no room"):
		status = http.StatusInsufficientStorage
	case errkind.Of(err) == errkind.TooLarge:
		status = http.StatusRequestEntityTooLarge
	case errkind.Of(err) == errkind.NotFound:
		status = http.StatusBadGateway
	case errkind.Of(err) == errkind.Invalid, errors.Is(err, context.Canceled):
		status = http.StatusBadRequest
	default:
		// safefs's refusals (a link, not a regular file, a directory):
		// what the request asked of the file cannot be.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			status = http.StatusBadRequest
		}
	}
	WriteError(w, status, fmt.Sprintf("%s: %v%s", name, err, homeHint(name)))
}

// signedFileCall says whether r, a GET or POST of /files, carries a
// signature of token as E2B's SDKs sign a file URL (signedBy).
func signedFileCall(r *http.Request, token string) bool {
	if token == "" || !isSignedFiles(r) || (r.Method != http.MethodGet && r.Method != http.MethodPost) {
		return false
	}
	return signedBy(r, token, time.Now())
}

// SignedFiles is the handler of serve's own /files (outside /e2b): the
// SDK makes a signed file URL by resolving "/files" against
// E2B_SANDBOX_URL, which drops its /e2b, and the URL carries none of the
// sandbox's headers: its sandbox is the one whose access token signed it
// (each of the door's sandboxes is tried, SHA-256 each). Anything else is
// 401.
func (h *Handler) SignedFiles() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.URL.Path, r.URL.RawPath = "/files", ""
		h.mu.Lock()
		var id string
		for rid, rec := range h.records {
			if signedFileCall(r, rec.envdToken) {
				id = rid
				break
			}
		}
		h.mu.Unlock()
		if id == "" {
			WriteError(w, http.StatusUnauthorized, "a file URL needs a valid signature of one of the sandboxes' (Sandbox.uploadUrl, downloadUrl), or its headers")
			return
		}
		rec, sb := h.lookup(id)
		if rec == nil {
			WriteError(w, http.StatusBadGateway, "The sandbox was not found: it ended, or never was")
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), callKey{}, &Call{Sandbox: sb, ID: id, User: rec.user, Port: EnvdPort, rec: rec}))
		h.envd.ServeHTTP(w, r)
	})
}
