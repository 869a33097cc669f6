// Package sdk is the Go backend SDK of the platform gateway: what a service
// backend imports to trust the calls the gateway forwards to it, and to talk
// back to the usage service.
//
// Two halves, matching the two directions of the wire contract
// (docs/wire-contract.md):
//
//   - Inbound: a [Verifier] checks the version 3 HMAC signature the gateway
//     puts on every forwarded call, sync (over the raw body) or async (over
//     the envelope's canonical form), and yields the trusted
//     [CallerContext]. [Verifier.Middleware] does it for an http.Handler.
//   - Outbound: a [Client] signs and sends usage reports, async progress and
//     completion, and the pre-flight key validation and usage estimate,
//     retrying transient failures without ever counting a report twice, and
//     verifying the signature of every pre-flight answer before trusting it.
//
// A [ReconciliationLog] (for example [NewJSONLinesLog]) receives one record
// per reported call, the evidence a backend keeps to settle disputes about
// what it billed.
//
// The package depends only on the standard library and the gateway's pure
// signing and billing packages, never on Caddy, so a backend's binary stays
// small. Header names carry a brand word, Platform by default; backends
// written for the platform this gateway replaces use the brand Tollara
// ([WithBrand], [Verifier.Brand]).
package sdk
