package platformgw

import (
	"net/http"
	"strings"
	"testing"
)

// FuzzParseInvokePath: any path either passes on (not under a gateway
// prefix's /service/), is refused as bad, or names exactly one service and
// one endpoint that rebuild the path byte for byte. An id never holds a '/',
// so "..", "%2e%2e" or an encoded slash cannot address a different route.
func FuzzParseInvokePath(f *testing.F) {
	for _, s := range []string{
		"/api/service/s/endpoint/e/invoke",
		"/api/service/s/endpoint/e/invoke/async",
		"/gateway/api/v1/service/s.1/endpoint/e-2/invoke",
		"/api/service/../endpoint/e/invoke",
		"/api/service/%2e%2e/endpoint/e/invoke",
		"/api/service/a%2Fb/endpoint/e/invoke",
		"/api/service/s/endpoint/e/invoke/",
		"/api/service//endpoint//invoke",
		"/api/service/s/endpoint/e/invoke/async/x",
		"/api/service/",
		"/apiservice/s/endpoint/e/invoke",
		"/api/service/s\x00/endpoint/e/invoke",
		"",
	} {
		f.Add(s)
	}
	prefixes := []string{"/api", "/gateway/api/v1"}
	f.Fuzz(func(t *testing.T, path string) {
		r, ok := parseInvokePath(prefixes, path)
		if ref, refOK := parseInvokePathSplit(prefixes, path); r != ref || ok != refOK {
			t.Fatalf("%q parsed as %+v %v, strings.Split's parse gives %+v %v", path, r, ok, ref, refOK)
		}
		if !ok {
			for _, p := range prefixes {
				if strings.HasPrefix(path, p+"/service/") {
					t.Fatalf("%q is under %s/service/ but was passed on", path, p)
				}
			}
			return
		}
		if r.bad {
			return
		}
		if r.serviceID == "" || r.endpointID == "" || strings.Contains(r.serviceID, "/") || strings.Contains(r.endpointID, "/") {
			t.Fatalf("%q: service %q endpoint %q", path, r.serviceID, r.endpointID)
		}
		rebuilt := r.prefix + "/service/" + r.serviceID + "/endpoint/" + r.endpointID + "/invoke"
		if r.async {
			rebuilt += "/async"
		}
		if rebuilt != path {
			t.Fatalf("%q parsed as %+v, which is %q", path, r, rebuilt)
		}
	})
}

// FuzzStripCallerHeaders: whatever headers a caller sends, none that a
// backend reads as the brand's (any case, '_' for '-') survives, nor
// Authorization, nor a Connection token that would make the proxy drop a
// header the gateway adds.
func FuzzStripCallerHeaders(f *testing.F) {
	f.Add("X-Platform-User-ID", "evil", "keep-alive, X-Platform-Signature")
	f.Add("X_Platform_User_ID", "evil", "x_platform_roles,Upgrade")
	f.Add("x-PLATFORM-signature", "forged", "X-Platform-Timestamp ,, close")
	f.Add("Authorization", "Bearer psk_x", "Authorization")
	f.Add("X-Platformish", "kept", "X-Platformish")
	f.Add("X-Platform-", "", ",")
	f.Fuzz(func(t *testing.T, name, value, connection string) {
		const prefix = "x-platform-"
		h := http.Header{}
		h[name] = []string{value}
		h[http.CanonicalHeaderKey(name)] = []string{value}
		h["Connection"] = []string{connection}
		stripCallerHeaders(h, prefix)
		for n := range h {
			if hasBrandPrefix(n, prefix) || strings.EqualFold(n, "Authorization") {
				t.Fatalf("%q survived", n)
			}
		}
		for _, v := range h.Values("Connection") {
			for _, tok := range strings.Split(v, ",") {
				tok = strings.TrimSpace(tok)
				folded := strings.ReplaceAll(strings.ToLower(tok), "_", "-")
				if strings.HasPrefix(folded, prefix) || tok == "" {
					t.Fatalf("Connection %q still names %q", v, tok)
				}
			}
		}
	})
}

// parseInvokePathSplit is parseInvokePath as it was written with
// strings.Split, the reference the allocation-free parse must agree with.
func parseInvokePathSplit(prefixes []string, path string) (r invokeRoute, ok bool) {
	for _, p := range prefixes {
		rest, found := strings.CutPrefix(path, strings.TrimSuffix(p, "/")+"/service/")
		if !found {
			continue
		}
		r.prefix = p
		parts := strings.Split(rest, "/")
		switch {
		case len(parts) == 4 && parts[1] == "endpoint" && parts[3] == "invoke":
		case len(parts) == 5 && parts[1] == "endpoint" && parts[3] == "invoke" && parts[4] == "async":
			r.async = true
		default:
			r.bad = true
			return r, true
		}
		r.serviceID, r.endpointID = parts[0], parts[2]
		if r.serviceID == "" || r.endpointID == "" {
			r.bad = true
		}
		return r, true
	}
	return r, false
}
