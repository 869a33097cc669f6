package storefront

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/url"
	"strings"
)

// The pages: html/template with one embedded stylesheet, no script, so
// the Content-Security-Policy allows nothing but that stylesheet and the
// images the operator's origins serve.

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets/storefront.css
var stylesheet []byte

var (
	indexPage    = parsePage("index")
	servicePageT = parsePage("service")
	notFoundPage = parsePage("notfound")
)

func parsePage(name string) *template.Template {
	return template.Must(template.ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
}

// site is what every page shows in its header and footer.
type site struct {
	Title, SignInURL, ContactURL string
}

// pageData is the data of any page; Base leads back to the storefront's
// root from the page's path, so links hold under whatever prefix
// handle_path stripped.
type pageData struct {
	Site      site
	Base      string
	PageTitle string

	// The front page.
	Cards      []*card
	Tags       []string
	Query, Tag string
	Service    *servicePage
	Message    string
}

func render(t *template.Template, d pageData) ([]byte, error) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", d); err != nil {
		return nil, fmt.Errorf("render %s: %w", t.Name(), err)
	}
	return buf.Bytes(), nil
}

// PlansURL is the portal's plans page of the service: the page under
// the portal that sign_in_url names; "" without a portal.
func (d pageData) PlansURL() string {
	if d.Site.SignInURL == "" || d.Service == nil {
		return ""
	}
	u, err := url.Parse(d.Site.SignInURL) // checked at setup (CheckLink)
	if err != nil {
		return ""
	}
	// The page under the sign-in's path; its query (a sign_in_url of
	// "/portal/?from=store") stays after it, not in the middle.
	u.Path = strings.TrimRight(u.Path, "/") + "/plans/" + d.Service.ID
	u.RawPath = ""
	return u.String()
}

// Home is the link to the front page from this page.
func (d pageData) Home() string {
	if d.Base == "" {
		return "./"
	}
	return d.Base
}
