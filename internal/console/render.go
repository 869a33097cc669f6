package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/platformgw/gateway/internal/billing"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// pageNames are the templates; each defines "content" inside base.html.
var pageNames = []string{"overview", "services", "users", "user", "usage", "jobs", "job", "audit", "alerts", "requests", "revenue", "confirm", "error", "notice"}

var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{
		"units": func(u billing.Units) string { return u.String() },
		"unitsp": func(u *billing.Units) string {
			if u == nil {
				return "—"
			}
			return u.Grouped()
		},
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		},
		// measured writes amounts of different measures side by side
		// ("12 request, 300 token"), never as one sum.
		"measured": func(ms []measured) string {
			if len(ms) == 0 {
				return "—"
			}
			parts := make([]string, len(ms))
			for i, m := range ms {
				parts[i] = m.Value.String() + " " + m.Of
			}
			return strings.Join(parts, ", ")
		},
		// costs writes costs of different kinds side by side ("29.00
		// EUR, 5 credits"); cost one amount with its kind (kindFor).
		"costs":    formatCosts,
		"cost":     func(v billing.Units, kind string) string { return formatCost(v, kind) },
		"kindof":   func(serviceID string, p *billing.Product) string { return kindFor(serviceID, p.ID, p) },
		"jobstate": jobStateWords,
		// clip shortens a long text for a table cell; its page has it whole.
		"clip": func(s string, n int) string {
			if len(s) <= n {
				return s
			}
			return strings.ToValidUTF8(s[:n], "") + "…"
		},
		"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
		"dur": func(d time.Duration) string {
			switch {
			case d == 0:
				return "—"
			case d < 0:
				return "> 1s"
			default:
				return "≤ " + d.String()
			}
		},
		// micros says a latency bucket's bound (ops.LatencyFigure) as "≤ 2.5ms".
		"micros": func(us int64) string {
			if us == 0 {
				return "—"
			}
			return "≤ " + (time.Duration(us) * time.Microsecond).String()
		},
		"query": func(kv ...string) url.Values {
			v := url.Values{}
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1] != "" {
					v.Set(kv[i], kv[i+1])
				}
			}
			return v
		},
	}
	out := map[string]*template.Template{}
	for _, n := range pageNames {
		out[n] = template.Must(template.New("base.html").Funcs(funcs).ParseFS(templateFS, "templates/base.html", "templates/"+n+".html"))
	}
	return out
}()

// page is what base.html renders around a page's content.
type page struct {
	Title   string
	Nav     string
	Who     string
	CSRF    string
	Prefix  string
	Refresh int
	Data    any
	// once makes a form's one-time value (once.go).
	once func() string
}

// Once is a new one-time value for a form that changes something: each
// form rendered gets its own (once.go).
func (p page) Once() string { return p.once() }

// L builds a console link (see Handler.link) for templates.
func (p page) L(parts ...string) string {
	h := &Handler{Prefix: p.Prefix}
	return h.link(nil, parts...)
}

// LQ builds a console link with a query.
func (p page) LQ(q url.Values, parts ...string) string {
	h := &Handler{Prefix: p.Prefix}
	return h.link(q, parts...)
}

// render writes a page: rendered to a buffer first, so a template error
// is a 500 and not half a page.
func (h *Handler) render(q *req, status int, name, title string, data any) {
	h.renderRefresh(q, status, name, title, data, 0)
}

func (h *Handler) renderRefresh(q *req, status int, name, title string, data any, refresh int) {
	if q.csrf == "" {
		q.csrf = h.csrfToken(q.w, q.r, q.who)
	}
	nav := name
	if name == "user" || name == "confirm" {
		nav = "users"
	}
	if name == "job" {
		nav = "jobs"
	}
	if c, ok := data.(confirmation); ok && c.Nav != "" {
		nav = c.Nav
	}
	var buf bytes.Buffer
	err := pages[name].Execute(&buf, page{Title: title, Nav: nav, Who: q.who, CSRF: q.csrf, Prefix: h.Prefix, Refresh: refresh, Data: data,
		once: func() string { return h.once.Mint(q.who) }})
	if err != nil {
		h.logger.Error("render console page", zap.String("page", name), zap.Error(err))
		http.Error(q.w, "internal error; see the server log", http.StatusInternalServerError)
		return
	}
	q.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	q.w.WriteHeader(status)
	q.w.Write(buf.Bytes())
}

// asset serves an embedded stylesheet or script.
func (h *Handler) asset(w http.ResponseWriter, r *http.Request, name string) {
	b, err := fs.ReadFile(assetFS, path.Join("assets", path.Base(name)))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	ct := "text/css; charset=utf-8"
	if path.Ext(name) == ".js" {
		ct = "text/javascript; charset=utf-8"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("Cache-Control", "max-age=300")
	w.Write(b)
}
