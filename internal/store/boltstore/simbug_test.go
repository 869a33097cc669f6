//go:build simbug

package boltstore

import (
	"testing"
	"time"
)

// TestSimCatchesPlantedBug: built with -tags simbug, the settlement log
// acknowledges a batch before its fdatasync and never reports a failed
// one (settlelog/planted_on.go). The simulation's CI slice must catch it:
// some seed of the slice fails the model (an acknowledged settlement
// missing after a crash). .ci/run runs it.
func TestSimCatchesPlantedBug(t *testing.T) {
	defer simSetup()()
	faults := simProfiles["crash"]
	start := time.Now()
	for _, seed := range simCISeeds {
		res := runSim(t, seed, genOps(seed, *simLen), faults)
		if res.err != nil {
			t.Logf("caught at seed %d, operation %d, after %s: %v", seed, res.step, time.Since(start).Round(time.Millisecond), res.err)
			return
		}
	}
	t.Fatalf("the CI slice (%d seeds) did not catch the planted bug (acknowledging before the sync)", len(simCISeeds))
}
