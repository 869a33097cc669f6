package boltstore

import "testing"

// TestSimFoundTraces replays the shortest traces of the failures random
// seeds of `make sim` found, each fixed since: each must pass the model
// now (docs/reliability.md, §14, "Found so far").
func TestSimFoundTraces(t *testing.T) {
	defer simSetup()()
	for _, c := range []struct {
		seed   uint64
		faults string
		ops    string
		why    string
	}{
		{4853817305462, "crash",
			"report0 seal job1 credit1 report0 call0 apply complete2 call1 crash call0 report1 job1 report0 call1 call1 report1 call0 job0 crash crash crash report1 call1 call1 complete2 job1 report0 report1 report1 call1 crash report0 report0 crash call0 credit1 complete5 report0 report1 complete3 report0 report0 call1 restart call1 crash",
			"a refused write, then a close whose apply stored the ledger's position past the log's end before power failed: the next start gave new records positions the ledger took for its own, and the settlement acknowledged after it was lost at the next crash"},
	} {
		ops, err := parseOps(c.ops)
		if err != nil {
			t.Fatal(err)
		}
		if res := runSim(t, c.seed, ops, simProfiles[c.faults]); res.err != nil {
			t.Errorf("seed %d (%s): %v", c.seed, c.why, res.err)
		}
	}
}
