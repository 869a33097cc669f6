//go:build simbug

package settlelog

// plantedAckBeforeSync, built with -tags simbug, plants a bug for the
// storage simulation to catch (internal/store/boltstore/simbug_test.go):
// sync mode tells a batch's callers it is durable once it is written,
// before the fdatasync, and never tells them that the fdatasync failed.
// Never build the gateway with this tag.
const plantedAckBeforeSync = true
