//go:build simbug_midop

package boltstore

import (
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/store/vfs"
)

// TestSimCatchesPlantedMidOpBug: built with -tags simbug_midop, the
// applier removes the settlement log's applied segments before the apply
// instead of after it (planted_on.go): a window that closes within one
// operation, unless the apply fails. With crashes alone (no failed writes
// or syncs), the CI slice must not find it when power fails only between
// operations, and must find it when power also fails during them.
// .ci/run runs it.
func TestSimCatchesPlantedMidOpBug(t *testing.T) {
	defer simSetup()()
	during := vfs.Faults{Crash: simMidCrash}
	for _, seed := range simCISeeds {
		if res := runSim(t, seed, genOps(seed, *simLen), vfs.Faults{}); res.err != nil {
			t.Fatalf("crashes between operations found it (seed %d, operation %d): then it is not a bug only a crash during one finds: %v",
				seed, res.step, res.err)
		}
	}
	start := time.Now()
	for _, seed := range simCISeeds {
		res := runSim(t, seed, genOps(seed, *simLen), during)
		if res.err != nil {
			t.Logf("caught at seed %d, operation %d, after %s: %v", seed, res.step, time.Since(start).Round(time.Millisecond), res.err)
			return
		}
	}
	t.Fatalf("the CI slice (%d seeds) did not catch the planted bug (releasing the log before the apply)", len(simCISeeds))
}
