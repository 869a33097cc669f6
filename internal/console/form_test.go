package console

import (
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/onceform"
)

// countingReader counts what the handler read of a body.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

type endlessA struct{}

func (endlessA) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

// huge is a body far past any limit, yet finite: were the limit lost, the
// test fails instead of filling the disk.
func huge() io.Reader { return io.LimitReader(endlessA{}, 64<<20) }

// TestConsoleFormBodies: a console POST is a form as a browser sends it,
// of at most maxFormBytes, read before anything else looks at it; any
// other body is refused with a page saying so (415, 413 or 400) and
// changes nothing. PostFormValue alone read a 200 MiB multipart body,
// spooling its file part to TMPDIR, before the CSRF check refused it (a
// review of security by default).
func TestConsoleFormBodies(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	e := local(t)
	h := direct(t, e, false)
	ctx := context.Background()
	if _, err := e.ops.PutSubscription(ctx, "test", "alice", "weather", "credits", ""); err != nil {
		t.Fatal(err)
	}
	c, token := session(t, h, "/console/users/alice", "bob")
	const path = "/console/users/alice/credits"
	good := func() url.Values {
		return url.Values{"csrf": {token}, onceform.Field: {h.once.Mint("bob")}, "serviceId": {"weather"}, "amount": {"5"}}
	}
	send := func(body io.Reader, contentType string) (*httptest.ResponseRecorder, int64) {
		cr := &countingReader{r: body}
		r := httptest.NewRequest("POST", path, cr)
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		r.AddCookie(c)
		return serve(h, r, "bob"), cr.n
	}
	check := func(name string, w *httptest.ResponseRecorder, read int64, status int, says string) {
		t.Helper()
		if w.Code != status || !strings.Contains(w.Body.String(), says) || !strings.Contains(w.Body.String(), "Nothing was changed") {
			t.Errorf("%s: %d, want %d saying %q: %s", name, w.Code, status, says, w.Body)
		}
		if read > maxFormBytes+4096 {
			t.Errorf("%s: read %d bytes of the body, the limit is %d", name, read, maxFormBytes)
		}
	}

	// A 64 MiB multipart upload, its fields all valid.
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		for k, v := range good() {
			mw.WriteField(k, v[0])
		}
		if fw, err := mw.CreateFormFile("blob", "x.bin"); err == nil {
			io.Copy(fw, huge()) // or until the reader is closed
		}
		mw.Close()
		pw.Close()
	}()
	w, read := send(pr, mw.FormDataContentType())
	pr.Close()
	check("multipart", w, read, http.StatusUnsupportedMediaType, "application/x-www-form-urlencoded")
	var spooled int64
	filepath.Walk(tmp, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			spooled += fi.Size()
		}
		return nil
	})
	if spooled > 0 {
		t.Errorf("multipart: %d bytes spooled to TMPDIR", spooled)
	}

	// Not a form at all, or no Content-Type.
	for _, ct := range []string{"application/json", "text/plain", ""} {
		w, read := send(strings.NewReader(`{"amount":5}`), ct)
		check("Content-Type "+ct, w, read, http.StatusUnsupportedMediaType, "application/x-www-form-urlencoded")
	}

	// A form whose fields are right, padded past the limit, by a little
	// and by 64 MiB.
	form := good()
	form.Set("pad", strings.Repeat("x", maxFormBytes))
	w, read = send(strings.NewReader(form.Encode()), "application/x-www-form-urlencoded")
	check("too large", w, read, http.StatusRequestEntityTooLarge, "at most 16 KiB")
	w, read = send(io.MultiReader(strings.NewReader(good().Encode()+"&pad="), huge()), "application/x-www-form-urlencoded; charset=utf-8")
	check("64 MiB", w, read, http.StatusRequestEntityTooLarge, "at most 16 KiB")

	// A form that does not parse.
	w, read = send(strings.NewReader(good().Encode()+"&%zz=1"), "application/x-www-form-urlencoded")
	check("malformed", w, read, http.StatusBadRequest, "could not be read")

	sub, _ := e.rt.Store().GetSubscription(ctx, "alice", "weather")
	entries, _, _ := e.ops.AuditLog(ctx, "", 10)
	if sub.Credits != 0 || len(entries) != 1 {
		t.Fatalf("refused POSTs changed something: credits %v, %d audit entries", sub.Credits, len(entries))
	}

	// The same form, as a browser sends it, is taken.
	w, _ = send(strings.NewReader(good().Encode()), "application/x-www-form-urlencoded")
	if w.Code != http.StatusSeeOther {
		t.Fatalf("good POST: %d %s", w.Code, w.Body)
	}
}
