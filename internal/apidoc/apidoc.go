// Package apidoc keeps docs/openapi.json, the OpenAPI document of the
// gateway's own routes (callers, backends, the public catalog and the
// admin API), true to the gateway: its test starts a gateway and checks
// that every documented operation answers as documented and that every
// route of the admin API's route table is documented. It holds no code
// the gateway runs.
package apidoc
