package publiccatalog

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/platformgw/gateway/internal/catalog"
	"github.com/platformgw/gateway/internal/wire"
)

// A service without an attached OpenAPI document gets one built from the
// catalog: OpenAPI 3.1, one path per invoke route (sync, and async on
// async endpoints) with the methods the endpoint allows, the service key
// as a bearer scheme, and the gateway's JSON error body
// (docs/wire-contract.md, "Errors") on every refusal it can answer. What
// the backend answers is the backend's: the 2xx is described, not its
// schema.

// DocOptions are what the generated document needs beyond the catalog.
type DocOptions struct {
	Options
	// Headers are the brand's header names (X-<Brand>-Request-ID).
	Headers wire.Headers
	// ServerURL is the public_url of the gateway; "/" when unset.
	ServerURL string
	// Attached is the OpenAPI document a service attaches, as JSON
	// (platform.App.OpenAPIDocument); nil when it attaches none, or
	// for none at all.
	Attached func(serviceID string) []byte
}

type obj = map[string]any

// OpenAPIDocument is the service's OpenAPI document as JSON: the attached
// one when the operator gave one, else one built from the catalog.
func OpenAPIDocument(s *catalog.Service, o DocOptions) ([]byte, error) {
	if o.Attached != nil {
		if doc := o.Attached(s.ID); doc != nil {
			return doc, nil
		}
	}
	return json.Marshal(BuildOpenAPI(s, o))
}

// errorRef is a response of the shared error body.
func errorRef(name string) obj { return obj{"$ref": "#/components/responses/" + name} }

// BuildOpenAPI builds the service's document from the catalog.
func BuildOpenAPI(s *catalog.Service, o DocOptions) obj {
	paths := obj{}
	ids := map[string]bool{} // the operationIds given, unique in a document
	for _, e := range s.Endpoints {
		invoke := InvokePath(o.GatewayPrefix, s.ID, e.ID)
		if !e.AsyncOnly {
			paths[invoke] = pathItem(e, o, false, ids)
		}
		if e.Async {
			paths[invoke+"/async"] = pathItem(e, o, true, ids)
		}
	}
	info := obj{"title": s.Name(), "version": "1"}
	if s.Description != "" {
		info["description"] = s.Description
	}
	server := o.ServerURL
	if server == "" {
		server = "/"
	}
	errorBody := obj{
		"type":     "object",
		"required": []string{"code", "message"},
		"properties": obj{
			"code":       obj{"type": "string", "description": "Stable machine-readable code; programs read this."},
			"message":    obj{"type": "string", "description": "For people; may change."},
			"retryAfter": obj{"type": "integer", "description": "Seconds to wait, on 429 (also in Retry-After)."},
			"requestId":  obj{"type": "string"},
			"field":      obj{"type": "string", "description": "The offending input, on invalid_request."},
		},
	}
	responses := obj{}
	for _, r := range errorResponses {
		responses[r.name] = obj{
			"description": r.description,
			"content":     obj{"application/json": obj{"schema": obj{"$ref": "#/components/schemas/Error"}}},
		}
	}
	return obj{
		"openapi": "3.1.0",
		"info":    info,
		"servers": []obj{{"url": server}},
		"paths":   paths,
		"components": obj{
			"securitySchemes": obj{"serviceKey": obj{
				"type": "http", "scheme": "bearer",
				"description": "A service key: Authorization: Bearer <service key>.",
			}},
			"schemas": obj{
				"Error": errorBody,
				"AsyncAccepted": obj{
					"type":     "object",
					"required": []string{"status", "requestId", "progressUrl", "callbackUrl"},
					"properties": obj{
						"status":      obj{"const": "ACCEPTED"},
						"requestId":   obj{"type": "string"},
						"progressUrl": obj{"type": "string", "description": "Poll the job's status here."},
						"callbackUrl": obj{"type": "string"},
					},
				},
				"WrappedResult": obj{
					"type":     "object",
					"required": []string{"requestId", "status", "result"},
					"properties": obj{
						"requestId":   obj{"type": "string"},
						"status":      obj{"const": "COMPLETED"},
						"result":      obj{"type": "string", "description": "The backend's body."},
						"contentType": obj{"type": []string{"string", "null"}},
						"resultUrl":   obj{"type": []string{"string", "null"}},
						"size":        obj{"type": "integer"},
						"completedAt": obj{"type": "string", "format": "date-time"},
					},
				},
			},
			"responses": responses,
		},
		"security": []obj{{"serviceKey": []string{}}},
	}
}

// errorResponses are the refusals every invoke may answer, by the status
// the wire contract gives their codes.
var errorResponses = []struct{ status, name, description string }{
	{"400", "InvalidRequest", "invalid_request or time_unit_invocation_not_allowed."},
	{"401", "Unauthorized", "missing_key, invalid_key, key_revoked or key_expired."},
	{"403", "Forbidden", "no_subscription, subscription_inactive or insufficient_credits."},
	{"404", "NotFound", "service_not_found or endpoint_not_found."},
	{"405", "MethodNotAllowed", "method_not_allowed (see Allow)."},
	{"413", "PayloadTooLarge", "payload_too_large."},
	{"429", "TooManyRequests", "quota_exceeded or rate_limited (see Retry-After)."},
	{"502", "ServiceError", "service_error: the backend could not be reached."},
	{"503", "StoreUnavailable", "store_unavailable: usage cannot be recorded now (see Retry-After)."},
	{"504", "ServiceTimeout", "service_timeout."},
}

func pathItem(e *catalog.Endpoint, o DocOptions, async bool, ids map[string]bool) obj {
	item := obj{}
	methods := Methods(e)
	for _, m := range methods {
		op := obj{
			"operationId": uniqueID(operationID(e.ID, m, async, len(methods) > 1), ids),
			"summary":     summary(e.ID, async),
			"responses":   responsesFor(e, o, async),
		}
		if m == "POST" || m == "PUT" {
			op["requestBody"] = obj{
				"description": "Passed to the backend as is.",
				"content":     obj{"*/*": obj{"schema": obj{}}},
			}
		}
		item[strings.ToLower(m)] = op
	}
	return item
}

func operationID(endpoint, method string, async, several bool) string {
	id := endpoint
	if several {
		id += "_" + strings.ToLower(method)
	}
	if async {
		id += "_async"
	}
	return id
}

// uniqueID is id, or id with "_2", "_3", … when an operation of the
// document has it already: endpoint ids may hold '_', so one endpoint's
// id can be another's with "_async" or its method added, and OpenAPI
// requires operationIds unique in a document.
func uniqueID(id string, ids map[string]bool) string {
	out := id
	for n := 2; ids[out]; n++ {
		out = id + "_" + strconv.Itoa(n)
	}
	ids[out] = true
	return out
}

func summary(endpoint string, async bool) string {
	if async {
		return "Start " + endpoint + " as a job"
	}
	return "Invoke " + endpoint
}

func responsesFor(e *catalog.Endpoint, o DocOptions, async bool) obj {
	requestID := obj{"description": "The request's id.", "schema": obj{"type": "string"}}
	r := obj{}
	switch {
	case async:
		r["202"] = obj{
			"description": "The job is accepted; its status is at progressUrl.",
			"headers":     obj{o.Headers.RequestID: requestID},
			"content":     obj{"application/json": obj{"schema": obj{"$ref": "#/components/schemas/AsyncAccepted"}}},
		}
	case e.WrapsSyncResponse():
		r["200"] = obj{
			"description": "The backend's 2xx answer, wrapped.",
			"headers":     obj{o.Headers.RequestID: requestID},
			"content":     obj{"application/json": obj{"schema": obj{"$ref": "#/components/schemas/WrappedResult"}}},
		}
	default:
		r["2XX"] = obj{
			"description": "The backend's answer, passed through.",
			"headers":     obj{o.Headers.RequestID: requestID},
		}
	}
	for _, er := range errorResponses {
		r[er.status] = errorRef(er.name)
	}
	return r
}
