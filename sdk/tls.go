package sdk

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"
)

// WithRootCAs makes the Client trust the gateway's certificate when it is
// signed by one of pool's authorities (and only then): a private CA, or
// Caddy's local CA for an https://localhost site. It builds the Client's
// transport, so it cannot be combined with WithHTTPClient; set RootCAs in
// your own client's TLS config instead.
func WithRootCAs(pool *x509.CertPool) Option {
	return func(s *settings) {
		if pool == nil {
			s.err = errors.Join(s.err, errors.New("WithRootCAs: nil pool"))
			return
		}
		s.rootCAs = pool
	}
}

// WithCAFile makes the Client trust the certificate authorities in the PEM
// file at path in addition to the system's. For a gateway serving
// https://localhost (or another name Caddy has no public certificate for),
// that is Caddy's local root certificate,
// $XDG_DATA_HOME/caddy/pki/authorities/local/root.crt (by default
// ~/.local/share/caddy/pki/authorities/local/root.crt of the user running
// Caddy). An empty path does nothing, so an unset environment variable can
// be passed as is. NewClient fails when the file cannot be read or holds no
// certificate.
func WithCAFile(path string) Option {
	return func(s *settings) {
		if path == "" {
			return
		}
		pool, err := loadCAFile(path)
		if err != nil {
			s.err = errors.Join(s.err, fmt.Errorf("WithCAFile: %w", err))
			return
		}
		s.rootCAs = pool
	}
}

// loadCAFile returns the system's roots plus the PEM certificates in path.
func loadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// httpClientWithRoots is the default http.Client, trusting pool.
func httpClientWithRoots(pool *x509.CertPool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}
}

// ErrUntrustedCertificate is wrapped by the errors of requests the Client
// could not make because it does not trust the gateway's TLS certificate
// (unknown authority, wrong name, expired). Retrying does not help, so the
// Client does not; the error's text says what to do.
var ErrUntrustedCertificate = errors.New("platform: the gateway's TLS certificate is not trusted")

// certificateHint explains a certificate error of a request to the gateway,
// or returns nil for any other error.
func certificateHint(err error) error {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("%w: %w; if the gateway uses Caddy's local CA (an https://localhost site), "+
			"pass sdk.WithCAFile with its root certificate (~/.local/share/caddy/pki/authorities/local/root.crt "+
			"of the user running Caddy) or set SSL_CERT_FILE to it; for a private CA, pass that CA; see docs/sdk.md, \"HTTPS and certificates\"",
			ErrUntrustedCertificate, err)
	case errors.As(err, &hostname):
		return fmt.Errorf("%w: %w; the base URL (or the host of the progress_url/callback_url) must be a name the certificate is for, "+
			"or use sdk.WithCallbacksViaBaseURL to post job reports to the base URL", ErrUntrustedCertificate, err)
	case errors.As(err, &invalid), errors.As(err, &verify):
		return fmt.Errorf("%w: %w", ErrUntrustedCertificate, err)
	}
	return nil
}
