package e2etest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"testing"
)

func TestEnvInt(t *testing.T) {
	for env, want := range map[string]int{"": 7, "12": 12, "0": 7, "-3": 7, "x": 7} {
		t.Setenv("E2ETEST_ENVINT", env)
		if got := EnvInt("E2ETEST_ENVINT", 7); got != want {
			t.Errorf("E2ETEST_ENVINT=%q: %d, want %d", env, got, want)
		}
	}
}

// TestUsageSign: the signature is HMAC-SHA256 over body then timestamp,
// Base64 (the vector is openssl's: printf 'body1700000000' | openssl dgst
// -sha256 -hmac secret -binary | base64), computed apart from the
// gateway's own signing code so that the e2e tests check that code.
func TestUsageSign(t *testing.T) {
	if got, want := UsageSign("secret", []byte("body"), "1700000000"), "TI5agtSo5P3oJGMT6fTcwJHFaQSkYHNpQPaP7cAaQSg="; got != want {
		t.Fatalf("UsageSign = %s, want %s", got, want)
	}
}

func TestFreePort(t *testing.T) {
	p := FreePort(t)
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Fatalf("port %d from FreePort: %v", p, err)
	}
	l.Close()
}

// TestAdminJSON: the body goes out as JSON with its content type, and the
// answer is decoded; a status other than the one wanted fails the test.
func TestAdminJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != "PUT" || r.Header.Get("Content-Type") != "application/json" || string(b) != `{"productId":"p"}` {
			http.Error(w, r.Method+" "+string(b), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"key":"k1"}`)
	}))
	defer srv.Close()
	var out struct {
		Key string `json:"key"`
	}
	AdminJSON(t, "PUT", srv.URL, map[string]any{"productId": "p"}, 201, &out)
	if out.Key != "k1" {
		t.Fatalf("decoded %+v", out)
	}

	ft := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { // Fatalf ends the goroutine, as it would the test's
		defer close(done)
		AdminJSON(ft, "PUT", srv.URL, map[string]any{"productId": "p"}, 200, nil)
	}()
	<-done
	if !ft.failed {
		t.Fatal("a 201 where 200 was wanted did not fail the test")
	}
}

// fatalTB records a Fatalf instead of failing the test.
type fatalTB struct {
	testing.TB
	failed bool
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.failed = true
	f.Logf("(expected) "+format, args...)
	runtime.Goexit()
}
