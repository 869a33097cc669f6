package portal

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.uber.org/zap"
	"golang.org/x/oauth2"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/ops"
)

// Signing in with OpenID Connect: the authorization code flow with PKCE
// against the operator's identity provider, the ID token checked by
// go-oidc (signature, issuer, audience, expiry) and its nonce by us, one
// claim mapped to the user id. The flow's HTTP side is oidcflow.go, its
// state cookie oidcstate.go.

// The values of user_claim.
const (
	ClaimEmail             = "email"
	ClaimSubject           = "sub"
	ClaimPreferredUsername = "preferred_username"
)

// OIDC configures sign-in with an OpenID Connect provider. Key sign-in
// stays whether or not it is set.
type OIDC struct {
	// Name is the provider's name on the sign-in button ("Sign in with
	// <name>"); the issuer's host name when empty.
	Name string `json:"name,omitempty"`
	// Issuer is the provider's issuer URL, exactly as its discovery
	// document (<issuer>/.well-known/openid-configuration) states it.
	Issuer string `json:"issuer"`
	// ClientID and ClientSecret are the portal's client at the provider.
	// Placeholders such as {env.PORTAL_OIDC_SECRET} are replaced at
	// provision, so the secret need not be in the config.
	ClientID     string `json:"client_id"`
	ClientSecret string `json:"client_secret,omitempty"`
	// RedirectURL is the portal's callback as registered at the provider:
	// the portal's address followed by /oidc/callback.
	RedirectURL string `json:"redirect_url"`
	// UserClaim is the ID token claim that becomes the user id: "email"
	// (the default; the provider must say the address is verified),
	// "sub" or "preferred_username".
	UserClaim string `json:"user_claim,omitempty"`
	// Scopes asked for; "openid email profile" when empty ("openid" is
	// always asked for).
	Scopes []string `json:"scopes,omitempty"`
	// AllowedDomains, if set, admits only people whose verified email
	// address is at one of these domains.
	AllowedDomains []string `json:"allowed_domains,omitempty"`
}

// check checks the settings that need no network, with the option
// names of the Caddyfile, and fills in the defaults.
func (o *OIDC) check() error {
	if o.Issuer == "" || o.ClientID == "" || o.RedirectURL == "" {
		return errors.New("oidc needs issuer, client_id and redirect_url")
	}
	for _, opt := range []string{"issuer", "redirect_url", "user_claim", "allowed_domains"} {
		if err := o.checkOption(opt); err != nil {
			return err
		}
	}
	if o.Name != "" {
		if err := o.checkOption("name"); err != nil {
			return err
		}
	}
	if o.UserClaim == "" {
		o.UserClaim = ClaimEmail
	}
	if o.Name == "" {
		iu, _ := url.Parse(o.Issuer)
		o.Name = iu.Hostname()
	}
	for i, d := range o.AllowedDomains {
		o.AllowedDomains[i] = strings.ToLower(strings.TrimPrefix(d, "@"))
	}
	return nil
}

// checkOption checks one option's value, as the Caddyfile gives it.
func (o *OIDC) checkOption(opt string) error {
	switch opt {
	case "issuer":
		iu, err := url.Parse(o.Issuer)
		if err != nil || (iu.Scheme != "https" && iu.Scheme != "http") || iu.Host == "" {
			return fmt.Errorf("oidc issuer '%s': an http(s) URL", catalog.ShownURL(o.Issuer))
		}
	case "redirect_url":
		ru, err := url.Parse(o.RedirectURL)
		if err != nil || (ru.Scheme != "https" && ru.Scheme != "http") || ru.Host == "" ||
			!strings.HasSuffix(ru.Path, "/oidc/callback") || ru.RawQuery != "" || ru.Fragment != "" {
			return fmt.Errorf("oidc redirect_url '%s': the portal's http(s) address followed by /oidc/callback", catalog.ShownURL(o.RedirectURL))
		}
	case "user_claim":
		switch o.UserClaim {
		case "", ClaimEmail, ClaimSubject, ClaimPreferredUsername:
		default:
			return fmt.Errorf("oidc user_claim %q: %s, %s or %s", o.UserClaim, ClaimEmail, ClaimSubject, ClaimPreferredUsername)
		}
	case "allowed_domains":
		for _, d := range o.AllowedDomains {
			d = strings.TrimPrefix(d, "@")
			if d == "" || strings.ContainsAny(d, "@/ ") || !strings.Contains(d, ".") {
				return fmt.Errorf("oidc allowed_domains %q: a domain such as example.com", d)
			}
		}
	case "name":
		if o.Name == "" || len(o.Name) > 64 {
			return fmt.Errorf("oidc name %q: 1 to 64 characters", o.Name)
		}
	}
	return nil
}

// scopes are the scopes asked for, "openid" first.
func (o *OIDC) scopes() []string {
	s := []string{oidc.ScopeOpenID}
	want := o.Scopes
	if len(want) == 0 {
		want = []string{"email", "profile"}
	}
	for _, v := range want {
		if v != oidc.ScopeOpenID {
			s = append(s, v)
		}
	}
	return s
}

// idClaims are the ID token claims the portal reads. email_verified is
// a boolean by the spec; some providers send the string "true".
type idClaims struct {
	Subject           string `json:"sub"`
	Email             string `json:"email"`
	EmailVerified     any    `json:"email_verified"`
	PreferredUsername string `json:"preferred_username"`
}

func (c idClaims) emailVerified() bool {
	switch v := c.EmailVerified.(type) {
	case bool:
		return v
	case string:
		return strings.EqualFold(v, "true")
	}
	return false
}

// errClaim is a sign-in refused for the person's claims; its text is
// shown to them as it is.
type errClaim struct{ message string }

func (e errClaim) Error() string { return e.message }

// userFromClaims maps an ID token's claims to the portal's user id: the
// claim user_claim names, within allowed_domains, and a valid user id
// (ops.ValidUserID, the one rule). An email address counts only when
// the provider says it is verified, since anyone can type one.
func userFromClaims(o *OIDC, c idClaims) (string, error) {
	needEmail := o.UserClaim == ClaimEmail || len(o.AllowedDomains) > 0
	if needEmail {
		if c.Email == "" {
			return "", errClaim{"Your account at " + o.Name + " did not tell the portal your email address, which it needs to sign you in. Ask the operator of this portal."}
		}
		if !c.emailVerified() {
			return "", errClaim{"Your email address at " + o.Name + " is not verified yet. Verify it there, then sign in again."}
		}
	}
	if len(o.AllowedDomains) > 0 {
		_, domain, _ := strings.Cut(c.Email, "@")
		allowed := false
		for _, d := range o.AllowedDomains {
			if strings.EqualFold(domain, d) {
				allowed = true
				break
			}
		}
		if !allowed {
			return "", errClaim{"Accounts at your email domain may not sign in to this portal."}
		}
	}
	var id string
	switch o.UserClaim {
	case ClaimEmail:
		id = strings.ToLower(c.Email)
	case ClaimSubject:
		id = c.Subject
	case ClaimPreferredUsername:
		id = c.PreferredUsername
	}
	if id == "" {
		return "", errClaim{"Your account at " + o.Name + " did not tell the portal who you are (" + o.UserClaim + "). Ask the operator of this portal."}
	}
	if !ops.ValidUserID(id) {
		return "", errClaim{"Your account at " + o.Name + " has a name this portal cannot use as a user id. Ask the operator of this portal."}
	}
	return id, nil
}

// Discovery's timings: each attempt's limit, and the waits between
// attempts while the provider cannot be reached (doubling up to the max).
var (
	discoveryTimeout  = 10 * time.Second
	discoveryFirstGap = 2 * time.Second
	discoveryMaxGap   = 5 * time.Minute
)

// oidcProvider is the provider found by discovery, or the reason it is
// not found yet. Provision tries once; if the provider is down, the
// portal starts anyway (key sign-in works) and a goroutine tries again
// with backoff until it answers or the config is unloaded.
type oidcProvider struct {
	cfg    *OIDC
	secret string // ClientSecret with its placeholders replaced
	client *http.Client
	logger *zap.Logger

	mu       sync.Mutex
	provider *oidc.Provider
	lastErr  error
}

func newOIDCProvider(cfg *OIDC, secret string, logger *zap.Logger) *oidcProvider {
	return &oidcProvider{cfg: cfg, secret: secret, logger: logger,
		client: &http.Client{Timeout: discoveryTimeout}}
}

// discover fetches the discovery document once.
func (p *oidcProvider) discover(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(oidc.ClientContext(ctx, p.client), discoveryTimeout)
	defer cancel()
	prov, err := oidc.NewProvider(ctx, p.cfg.Issuer)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.lastErr = fmt.Errorf("oidc discovery at %s: %w", p.cfg.Issuer, err)
		return p.lastErr
	}
	p.provider, p.lastErr = prov, nil
	return nil
}

// start discovers the provider, and while it cannot be reached keeps
// trying in the background until ctx ends.
func (p *oidcProvider) start(ctx context.Context) {
	err := p.discover(ctx)
	if err == nil {
		return
	}
	p.logger.Error("portal: the identity provider cannot be reached; sign-in with it is off until it can, key sign-in works; retrying",
		zap.String("issuer", p.cfg.Issuer), zap.Error(err))
	go func() {
		gap := discoveryFirstGap
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(gap):
			}
			if err := p.discover(ctx); err == nil {
				p.logger.Info("portal: the identity provider answered; sign-in with it is on", zap.String("issuer", p.cfg.Issuer))
				return
			} else if ctx.Err() == nil {
				p.logger.Warn("portal: the identity provider still cannot be reached", zap.String("issuer", p.cfg.Issuer),
					zap.Duration("next_try_in", min(2*gap, discoveryMaxGap)), zap.Error(err))
			}
			gap = min(2*gap, discoveryMaxGap)
		}
	}()
}

// ready is the provider once discovery has succeeded.
func (p *oidcProvider) ready() (*oidc.Provider, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.provider, p.provider != nil
}

// oauth2Config is the client of the code flow.
func (p *oidcProvider) oauth2Config(prov *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{
		ClientID: p.cfg.ClientID, ClientSecret: p.secret, RedirectURL: p.cfg.RedirectURL,
		Endpoint: prov.Endpoint(), Scopes: p.cfg.scopes(),
	}
}
