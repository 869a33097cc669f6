package catalog

import (
	"strings"
	"testing"

	"github.com/platformgw/gateway/internal/billing"
)

func service() *Service {
	q := billing.Whole(10)
	return &Service{
		ID:        "weather",
		Backend:   "https://backend.internal:8443/v2/",
		Secrets:   []string{"0123456789abcdef0123"},
		Owners:    []string{"alice"},
		Endpoints: []*Endpoint{{ID: "forecast"}, {ID: "post", Methods: []string{"post"}, Path: "/p"}},
		Products: []*billing.Product{{ID: "basic", BillingModel: billing.Subscription,
			MeasurementType: billing.PerRequest, Quota: &q}},
	}
}

func TestCompile(t *testing.T) {
	c, err := Compile([]*Service{service()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := c.Service("weather")
	if !ok || c.Len() != 1 {
		t.Fatal("service not found")
	}
	if got := s.BackendURL().String(); got != "https://backend.internal:8443/v2" {
		t.Errorf("backend %q: the trailing slash must go so paths join cleanly", got)
	}
	e, _ := s.Endpoint("forecast")
	if e.Path != "/forecast" || !e.Allows("GET") || !e.Allows("DELETE") || e.UnitCost() != billing.Scale {
		t.Errorf("defaults of an endpoint: %+v", e)
	}
	p, _ := s.Endpoint("post")
	if !p.Allows("POST") || p.Allows("GET") {
		t.Error("methods are case-insensitive and exclusive")
	}
	if !s.IsOwner("alice") || s.IsOwner("bob") {
		t.Error("owners")
	}
	if _, ok := s.Product("basic"); !ok {
		t.Error("product")
	}
	if string(s.SigningSecret()) != "0123456789abcdef0123" || len(s.VerifySecrets()) != 1 {
		t.Error("secrets")
	}
}

func TestCompileResolvesSecrets(t *testing.T) {
	s := service()
	s.Secrets = []string{"{env.NEW}", "{env.OLD}"}
	vals := map[string]string{"{env.NEW}": "new-secret-0123456789", "{env.OLD}": "old-secret-0123456789"}
	c, err := Compile([]*Service{s}, func(v string) (string, error) { return vals[v], nil })
	if err != nil {
		t.Fatal(err)
	}
	got, _ := c.Service("weather")
	if string(got.SigningSecret()) != "new-secret-0123456789" || string(got.VerifySecrets()[1]) != "old-secret-0123456789" {
		t.Error("the first secret signs, both verify")
	}
}

func TestCompileRefuses(t *testing.T) {
	cases := []struct {
		name string
		mod  func(s *Service)
		want string
	}{
		{"bad id", func(s *Service) { s.ID = "a/b" }, "service id"},
		{"dotdot id", func(s *Service) { s.ID = "a..b" }, "service id"},
		{"ftp backend", func(s *Service) { s.Backend = "ftp://x" }, "http or https"},
		{"backend with query", func(s *Service) { s.Backend = "http://x/?a=1" }, "no query"},
		{"backend with user", func(s *Service) { s.Backend = "http://u:p@x" }, "http or https"},
		{"no secret", func(s *Service) { s.Secrets = nil }, "one secret"},
		{"three secrets", func(s *Service) { s.Secrets = []string{"0123456789abcdef", "0123456789abcdeg", "0123456789abcdeh"} }, "one secret"},
		{"short secret", func(s *Service) { s.Secrets = []string{"short"} }, "shorter than 16"},
		{"same secret twice", func(s *Service) { s.Secrets = []string{s.Secrets[0], s.Secrets[0]} }, "given twice"},
		{"owner with a slash", func(s *Service) { s.Owners = []string{"a/b"} }, "owner 'a/b'"},
		{"unprintable unit", func(s *Service) { s.Products[0].UnitLabel = "a\nb" }, "printable"},
		{"no endpoints", func(s *Service) { s.Endpoints = nil }, "no endpoints"},
		{"duplicate endpoint", func(s *Service) { s.Endpoints = append(s.Endpoints, &Endpoint{ID: "forecast"}) }, "declared twice"},
		{"bad method", func(s *Service) { s.Endpoints[0].Methods = []string{"PATCH"} }, "method"},
		{"relative path", func(s *Service) { s.Endpoints[0].Path = "x" }, "must start with /"},
		{"path with query", func(s *Service) { s.Endpoints[0].Path = "/x?y" }, "must start with /"},
		{"negative cost", func(s *Service) { c := billing.Units(-1); s.Endpoints[0].Cost = &c }, "negative cost"},
		{"async_only without async", func(s *Service) { s.Endpoints[0].AsyncOnly = true }, "async_only needs async"},
		{"bad product", func(s *Service) { s.Products[0].BillingModel = "FREE" }, "billing model"},
		{"duplicate product", func(s *Service) { s.Products = append(s.Products, s.Products[0]) }, "declared twice"},
		{"nil product", func(s *Service) { s.Products = append(s.Products, nil) }, "empty product"},
		{"bad service sync_response", func(s *Service) { s.SyncResponse = "json" }, "sync_response"},
		{"bad endpoint sync_response", func(s *Service) { s.Endpoints[0].SyncResponse = "Wrapped" }, "sync_response"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := service()
			tc.mod(s)
			_, err := Compile([]*Service{s}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want it to mention %q", err, tc.want)
			}
		})
	}
	if _, err := Compile([]*Service{service(), service()}, nil); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate service: %v", err)
	}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"a": true, "svc-1.v2_x~y": true, "": false, ".": false, "..": false, "a..b": false,
		".hidden": false, "a/b": false, "a b": false, "é": false, strings.Repeat("a", 128): true, strings.Repeat("a", 129): false,
	} {
		if ValidID(id) != ok {
			t.Errorf("ValidID(%q) = %v", id, !ok)
		}
	}
}

func TestSyncResponse(t *testing.T) {
	for _, tc := range []struct {
		service, endpoint string
		want              bool
	}{
		{"", "", false},
		{SyncRaw, "", false},
		{SyncWrapped, "", true},
		{SyncWrapped, SyncRaw, false},
		{"", SyncWrapped, true},
		{SyncRaw, SyncWrapped, true},
	} {
		s := service()
		s.SyncResponse, s.Endpoints[0].SyncResponse = tc.service, tc.endpoint
		if _, err := Compile([]*Service{s}, nil); err != nil {
			t.Fatal(err)
		}
		if got := s.Endpoints[0].WrapsSyncResponse(); got != tc.want {
			t.Errorf("service %q, endpoint %q: wrapped %v, want %v", tc.service, tc.endpoint, got, tc.want)
		}
	}
}

// TestSharedSecrets: a secret held by two services lets each sign as the
// other, so the services that share one are listed (the platform warns
// at load), each once, against the first service that holds it, whether
// the secret is the current or the previous one; distinct secrets list
// nothing.
func TestSharedSecrets(t *testing.T) {
	svc := func(id string, secrets ...string) *Service {
		s := service()
		s.ID = id
		s.Secrets = secrets
		return s
	}
	const a, b, c = "secret-a-0123456789", "secret-b-0123456789", "secret-c-0123456789"
	cases := []struct {
		name     string
		services []*Service
		want     [][2]string
	}{
		{"distinct", []*Service{svc("s1", a), svc("s2", b), svc("s3", c, a+"x")}, nil},
		{"current shared", []*Service{svc("s1", a), svc("s2", a)}, [][2]string{{"s2", "s1"}}},
		{"previous of one is the other's current", []*Service{svc("s1", b, a), svc("s2", a)}, [][2]string{{"s2", "s1"}}},
		{"both shared with the same service, named once", []*Service{svc("s1", a, b), svc("s2", a, b)}, [][2]string{{"s2", "s1"}}},
		{"three services", []*Service{svc("s1", a), svc("s2", b), svc("s3", a), svc("s4", c, b)},
			[][2]string{{"s3", "s1"}, {"s4", "s2"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cat, err := Compile(tc.services, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := cat.SharedSecrets()
			if len(got) != len(tc.want) {
				t.Fatalf("SharedSecrets() = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("SharedSecrets() = %v, want %v", got, tc.want)
				}
			}
		})
	}
}
