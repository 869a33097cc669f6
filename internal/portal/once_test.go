package portal

import (
	"context"
	htmlstd "html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
)

var (
	formRE   = regexp.MustCompile(`(?s)<form [^>]*>.*?</form>`)
	hiddenRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)
)

// formOf is the hidden fields of the page's form whose opening tag holds
// mark (an action): what the browser sends with it.
func formOf(t *testing.T, body, mark string) url.Values {
	t.Helper()
	for _, f := range formRE.FindAllString(body, -1) {
		if open, _, _ := strings.Cut(f, ">"); !strings.Contains(open, mark) {
			continue
		}
		v := url.Values{}
		for _, m := range hiddenRE.FindAllStringSubmatch(f, -1) {
			v.Add(htmlstd.UnescapeString(m[1]), htmlstd.UnescapeString(m[2]))
		}
		return v
	}
	t.Fatalf("no form %s on the page:\n%s", mark, body)
	return nil
}

// keyForm is the create-key form of a dashboard with label filled in.
func keyForm(t *testing.T, page, label string) url.Values {
	t.Helper()
	v := formOf(t, page, `action="/portal/keys"`)
	v.Set("label", label)
	return v
}

// TestCreateKeyTakenOnce: the create-key form is taken once. Its second
// POST (a double click, a reload of the page that showed the new key)
// made a second key the caller never saw, which still counted toward
// max_active_keys. Now it makes none and answers 409 "Already made";
// eight POSTs of one form at once make one key; a refused form (the key
// limit) gives its value back; a form without its value is refused.
func TestCreateKeyTakenOnce(t *testing.T) {
	e := local(t, "sign_in_limit 1000\nallow_key_management\nmax_active_keys 3")
	key, _ := e.user("pia", "basic")
	c := e.newClient()
	page := c.signIn(key)
	count := func() int {
		t.Helper()
		keys, err := e.store().ListKeys(context.Background(), "pia")
		if err != nil {
			t.Fatal(err)
		}
		return len(keys)
	}
	form := keyForm(t, page, "ci")
	resp, first := c.post("/portal/keys", form)
	if resp.StatusCode != http.StatusCreated || !newKeyField.MatchString(first) {
		t.Fatalf("first POST: %d\n%s", resp.StatusCode, first)
	}
	resp, again := c.post("/portal/keys", form)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(again, "Already made") ||
		!strings.Contains(again, "Nothing was changed this time") || newKeyField.MatchString(again) {
		t.Errorf("the same form again: %d\n%s", resp.StatusCode, again)
	}
	if n := count(); n != 2 {
		t.Fatalf("%d keys after one form posted twice, want 2 (the sign-in key and one)", n)
	}

	// A double click with many clicks: the POSTs race, one key is made.
	form = keyForm(t, first, "burst")
	var wg sync.WaitGroup
	made := make(chan int, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _ := c.post("/portal/keys", form)
			made <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(made)
	created := 0
	for code := range made {
		switch code {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
		default:
			t.Errorf("a POST of the burst answered %d", code)
		}
	}
	if created != 1 || count() != 3 {
		t.Fatalf("eight POSTs of one form at once: %d answered 201, %d keys; want 1 and 3", created, count())
	}

	// At the key limit the form is refused and changes nothing, so its
	// value is given back: after a revocation the same form makes a key.
	_, page = c.get("/portal/")
	form = keyForm(t, page, "after")
	if resp, body := c.post("/portal/keys", form); resp.StatusCode != http.StatusConflict || !strings.Contains(body, "the most this portal allows") {
		t.Fatalf("at the limit: %d\n%s", resp.StatusCode, body)
	}
	keys, _ := e.store().ListKeys(context.Background(), "pia")
	for _, k := range keys {
		if k.Label == "ci" {
			if _, err := e.ops.RevokeKey(context.Background(), "test", k.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if resp, body := c.post("/portal/keys", form); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the refused form sent again after a revocation: %d\n%s", resp.StatusCode, body)
	}

	// Without its one-time value, or with another's, nothing is made.
	_, page = c.get("/portal/")
	before := count()
	for name, v := range map[string]string{"none": "", "made up": strings.Repeat("A", 48)} {
		f := keyForm(t, page, "x")
		f.Del("once")
		if v != "" {
			f.Set("once", v)
		}
		if resp, body := c.post("/portal/keys", f); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "one-time value") {
			t.Errorf("%s: %d\n%s", name, resp.StatusCode, body)
		}
	}
	if n := count(); n != before {
		t.Fatalf("refused forms made %d keys", n-before)
	}
}
