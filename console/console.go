// Package console is sqlstreams' web console: an http.Handler to mount in
// an application (River UI's shape), or to run with `sqlstreams console`.
// It shows streams, each group's progress (lag, and what it has available,
// in flight and retrying, dead letters, oldest age, sessions), its binding
// set with waiters, its
// declared and effective config with history, and its dead letters with
// their delivery history; it redrives dead letters (one, selected, all).
// It is server-rendered HTML with a few lines of JavaScript for live
// refresh, built on the read-only group handle and its action verbs only.
//
// Deny by default: the application supplies Options.Authorize, which
// decides per request whether the caller may read, see payloads and act.
// Without it the console serves one page saying how to configure it.
// Actions are POSTs carrying a CSRF token (a cookie and a form field that
// must match, and a same-origin check).
//
// It is an API for users.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/c1702965/sqlstreams"
)

// Access is what one request may do.
type Access struct {
	Read     bool // see streams, groups, config, dead letters (no payloads)
	Payloads bool // see dead letters' payloads and headers
	Actions  bool // redrive
}

// Options configure the console.
type Options struct {
	// Authorize decides, per request, what its caller may do. nil serves
	// only a page saying how to configure it (deny by default).
	Authorize func(*http.Request) Access
	// DeadLetterPage is how many dead letters a page lists. Default 100, at
	// most 1000.
	DeadLetterPage int
	// Timeout bounds one request's database reads. Default 10s.
	Timeout time.Duration
}

//go:embed templates/*.html
var templates embed.FS

var pages = template.Must(template.New("").Funcs(template.FuncMap{
	"ago": ago,
	// json is a value as one line of JSON (a declared config).
	"json": func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			return err.Error()
		}
		return string(b)
	},
	"stamp": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	},
	"path":  url.PathEscape,
	"bound": func() int { return sqlstreams.StatusCountBound },
}).ParseFS(templates, "templates/*.html"))

// ago rounds an age for people, as the CLI does: milliseconds under a
// second, seconds under an hour, minutes past it.
func ago(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

// Handler is the console.
type Handler struct {
	client *sqlstreams.Client
	opts   Options
	mux    *http.ServeMux
}

// New returns the console for client.
func New(client *sqlstreams.Client, opts *Options) *Handler {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.DeadLetterPage <= 0 {
		o.DeadLetterPage = 100
	}
	o.DeadLetterPage = min(o.DeadLetterPage, 1000)
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	h := &Handler{client: client, opts: o, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /{$}", h.streams)
	h.mux.HandleFunc("GET /streams/{stream}/groups/{group}", h.group)
	h.mux.HandleFunc("GET /streams/{stream}/groups/{group}/dead/{id}", h.deadLetter)
	h.mux.HandleFunc("POST /streams/{stream}/groups/{group}/redrive", h.redrive)
	return h
}

type ctxKey struct{}

// ServeHTTP implements http.Handler. Mount it under a prefix with
// http.StripPrefix.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'")
	if h.opts.Authorize == nil {
		w.WriteHeader(http.StatusForbidden)
		h.render(w, "unconfigured.html", nil)
		return
	}
	a := h.opts.Authorize(r)
	if !a.Read {
		http.Error(w, "forbidden: the console's Authorize hook grants this request no access", http.StatusForbidden)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), ctxKey{}, a), h.opts.Timeout)
	defer cancel()
	h.mux.ServeHTTP(w, r.WithContext(ctx))
}

func access(r *http.Request) Access { a, _ := r.Context().Value(ctxKey{}).(Access); return a }

func (h *Handler) render(w http.ResponseWriter, name string, data any) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pages.ExecuteTemplate(w, name, data); err != nil {
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
	}
}

// fail answers an error in one line; a name that is not registered is 404.
func fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, sqlstreams.ErrNotRegistered), errors.Is(err, sqlstreams.ErrGroupStream), errors.Is(err, sqlstreams.ErrInvalidName):
		code = http.StatusNotFound
	case errors.Is(err, sqlstreams.ErrInvalidConfig):
		code = http.StatusBadRequest
	}
	http.Error(w, strings.Join(strings.Fields(err.Error()), " "), code)
}

type streamRow struct {
	sqlstreams.StreamInfo
	Head   int64
	Groups []*sqlstreams.GroupStatus
}

func (h *Handler) streams(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	streams, err := h.client.Streams(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	var rows []streamRow
	for _, s := range streams {
		row := streamRow{StreamInfo: s}
		for _, name := range s.Groups {
			g, err := h.client.Group(ctx, s.Name, name)
			if err != nil {
				fail(w, err)
				return
			}
			st, err := g.Status(ctx)
			if err != nil {
				fail(w, err)
				return
			}
			row.Head = st.Head.ID
			row.Groups = append(row.Groups, st)
		}
		rows = append(rows, row)
	}
	h.render(w, "streams.html", map[string]any{"Streams": rows})
}

func (h *Handler) group(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	g, err := h.client.Group(ctx, r.PathValue("stream"), r.PathValue("group"))
	if err != nil {
		fail(w, err)
		return
	}
	st, err := g.Status(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	b, err := g.Bindings(ctx, 0)
	if err != nil {
		fail(w, err)
		return
	}
	in, err := g.Inspect(ctx)
	if err != nil {
		fail(w, err)
		return
	}
	after, _ := strconv.ParseInt(r.URL.Query().Get("after"), 10, 64)
	dead, err := g.DeadLetters(ctx, max(after, 0), h.opts.DeadLetterPage)
	if err != nil {
		fail(w, err)
		return
	}
	next := int64(0)
	if len(dead) == h.opts.DeadLetterPage {
		next = dead[len(dead)-1].MessageID
	}
	h.render(w, "group.html", map[string]any{"Status": st, "Bindings": b, "Inspection": in, "Dead": dead, "Next": next,
		"Access": access(r), "CSRF": csrfToken(w, r), "Flash": r.URL.Query().Get("done")})
}

func (h *Handler) deadLetter(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	g, err := h.client.Group(ctx, r.PathValue("stream"), r.PathValue("group"))
	if err != nil {
		fail(w, err)
		return
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		http.Error(w, "message id: want a positive integer", http.StatusBadRequest)
		return
	}
	d, err := g.DeadLetter(ctx, id)
	if err != nil {
		fail(w, err)
		return
	}
	a := access(r)
	payload := ""
	if a.Payloads {
		payload = string(d.Payload)
	}
	h.render(w, "dead.html", map[string]any{"Stream": g.Stream(), "Group": g.Name(), "D": d, "Payload": payload,
		"Access": a, "CSRF": csrfToken(w, r)})
}

func (h *Handler) redrive(w http.ResponseWriter, r *http.Request) {
	if !access(r).Actions {
		http.Error(w, "forbidden: the console's Authorize hook grants this request no actions", http.StatusForbidden)
		return
	}
	if err := checkCSRF(r); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	ctx := r.Context()
	g, err := h.client.Group(ctx, r.PathValue("stream"), r.PathValue("group"))
	if err != nil {
		fail(w, err)
		return
	}
	var n int64
	if r.PostForm.Get("all") == "1" {
		n, err = g.RedriveAll(ctx)
	} else {
		var ids []int64
		for _, v := range r.PostForm["id"] {
			id, perr := strconv.ParseInt(v, 10, 64)
			if perr != nil || id < 1 {
				http.Error(w, fmt.Sprintf("message id %q: want a positive integer", v), http.StatusBadRequest)
				return
			}
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			http.Error(w, "nothing selected: give id fields, or all=1", http.StatusBadRequest)
			return
		}
		n, err = g.RedriveIDs(ctx, ids)
	}
	if err != nil {
		fail(w, err)
		return
	}
	http.Redirect(w, r, fmt.Sprintf("/streams/%s/groups/%s?done=%s", url.PathEscape(g.Stream()), url.PathEscape(g.Name()),
		url.QueryEscape(fmt.Sprintf("redrove %d dead letter(s)", n))), http.StatusSeeOther)
}

const csrfCookie = "sqlstreams_csrf"

// csrfToken returns the request's token, setting a new cookie when it has
// none: the double-submit pattern (a cross-site form cannot read the cookie
// to copy it into its field).
func csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		return c.Value
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	t := hex.EncodeToString(b[:])
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	return t
}

func checkCSRF(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return errors.New("forbidden: a cross-origin request")
		}
	}
	if err := r.ParseForm(); err != nil {
		return errors.New("forbidden: the form does not parse")
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" || subtle.ConstantTimeCompare([]byte(c.Value), []byte(r.PostForm.Get("csrf"))) != 1 {
		return errors.New("forbidden: a missing or wrong CSRF token (reload the page)")
	}
	return nil
}
