package servicekey

import "time"

// Status is what a stored key is at a given time. It is the one rule of
// whether a key may still be used: the gateway refuses a key that is not
// Active (with the error its status names), and the admin API, the
// console and the portal show and count keys by it, so a key is never
// shown active while the gateway refuses it, or the other way round.
type Status string

// The statuses, as the admin API shows them.
const (
	Active  Status = "active"
	Expired Status = "expired"
	Revoked Status = "revoked"
)

// StatusAt is the status at now of a key revoked at revokedAt and expiring
// at expiresAt (zero: not revoked, never expires). Revoked wins over
// expired. A key expires at the instant expiresAt (now >= expiresAt), as a
// context's deadline does.
func StatusAt(revokedAt, expiresAt, now time.Time) Status {
	switch {
	case !revokedAt.IsZero():
		return Revoked
	case !expiresAt.IsZero() && !now.Before(expiresAt):
		return Expired
	}
	return Active
}

// ActiveAt reports whether a key revoked at revokedAt and expiring at
// expiresAt authenticates at now (StatusAt is Active).
func ActiveAt(revokedAt, expiresAt, now time.Time) bool {
	return StatusAt(revokedAt, expiresAt, now) == Active
}
