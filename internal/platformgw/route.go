package platformgw

import "strings"

// invokeRoute is a parsed {prefix}/service/{serviceId}/endpoint/{endpointId}/invoke[/async].
type invokeRoute struct {
	prefix     string
	serviceID  string
	endpointID string
	async      bool
	bad        bool // under {prefix}/service/ but not an invoke path
}

// parseInvokePath matches path against the gateway prefixes. ok is false
// when the path is not under any {prefix}/service/, so the handler passes
// it on; bad marks a path that is, but is not a well-formed invoke route.
func parseInvokePath(prefixes []string, path string) (r invokeRoute, ok bool) {
	for _, p := range prefixes {
		rest, found := strings.CutPrefix(path, strings.TrimSuffix(p, "/")+"/service/")
		if !found {
			continue
		}
		r.prefix = p
		// serviceId / "endpoint" / endpointId / "invoke" [/ "async"], cut
		// into an array: strings.Split allocated a slice on every call.
		var parts [5]string
		n := 0
		for s := rest; ; {
			if n == len(parts) {
				n++ // a sixth part: not an invoke path
				break
			}
			head, tail, more := strings.Cut(s, "/")
			parts[n] = head
			n++
			if !more {
				break
			}
			s = tail
		}
		switch {
		case n == 4 && parts[1] == "endpoint" && parts[3] == "invoke":
		case n == 5 && parts[1] == "endpoint" && parts[3] == "invoke" && parts[4] == "async":
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
