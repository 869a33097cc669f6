//go:build scale

// The scale benchmark (make bench-scale): key lookup and invoke metering
// in a store of 1,000,000 keys and 10,000,000 ledger rows against an empty
// store, each measured in a process of its own so that its resident
// memory is its own. It writes several GB and takes minutes, so it sits
// behind the scale build tag, out of make test.
//
//	go test -tags scale -run TestScale -v -timeout 60m ./internal/store/boltstore
//
// SCALE_KEYS and SCALE_LEDGER change the sizes; SCALE_DIR keeps the big
// store (default: a temporary directory, removed afterwards).
package boltstore

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// scaleResult is what one measuring process reports.
type scaleResult struct {
	Keys, LedgerRows    int
	FileBytes           int64
	OpenSeconds         float64
	HotLookupsPerSec    float64 // one key, again and again: the read cache
	RandomLookupsPerSec float64 // any key of the store through the read cache
	BoltLookupsPerSec   float64 // any key, a bbolt read transaction each (no cache)
	InvokesPerSec       float64 // Reserve + Settle, 64 callers, 64 subscriptions
	VmRSSKiB, VmHWMKiB  int64
	RssAnonKiB          int64
	RssFileKiB          int64
}

const scaleUsers = 64

func scaleEnvInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

func scaleKeyHash(i int) [32]byte { return sha256.Sum256([]byte("psk_scale_" + strconv.Itoa(i))) }

func TestScale(t *testing.T) {
	if path := os.Getenv("SCALE_MEASURE"); path != "" {
		measureScale(t, path)
		return
	}
	nKeys := scaleEnvInt("SCALE_KEYS", 1_000_000)
	nLedger := scaleEnvInt("SCALE_LEDGER", 10_000_000)
	dir := os.Getenv("SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}

	empty := filepath.Join(dir, "empty.db")
	os.Remove(empty)
	loadScale(t, empty, 1000, 0)

	big := filepath.Join(dir, fmt.Sprintf("scale-%d-%d.db", nKeys, nLedger))
	if _, err := os.Stat(big); err != nil {
		start := time.Now()
		loadScale(t, big, nKeys, nLedger)
		t.Logf("loaded %d keys and %d ledger rows in %s", nKeys, nLedger, time.Since(start).Round(time.Second))
	}
	// Alternate the two stores, several rounds, and compare each round's
	// pair: the machine is shared and its speed drifts, so a figure alone
	// means little, and the ratio of two measured back to back far more.
	rounds := max(scaleEnvInt("SCALE_ROUNDS", 5), 1)
	var smalls, larges []scaleResult
	for range rounds {
		smalls = append(smalls, runMeasure(t, empty, 1000, 0))
		larges = append(larges, runMeasure(t, big, nKeys, nLedger))
	}
	small, large := medianResult(smalls), medianResult(larges)
	pairRatio := func(f func(scaleResult) float64) string {
		v := make([]float64, rounds)
		for i := range v {
			v[i] = f(larges[i]) / f(smalls[i])
		}
		slices.Sort(v)
		return fmt.Sprintf("%.2fx", v[rounds/2])
	}
	t.Logf("median of %d rounds", rounds)

	var out strings.Builder
	fmt.Fprintf(&out, "\n| store | keys | ledger rows | file MiB | open s | hot lookup/s | random lookup/s | bbolt lookup/s | invokes/s | VmRSS MiB | VmHWM MiB |\n")
	fmt.Fprintf(&out, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range []struct {
		name string
		r    scaleResult
	}{{"empty", small}, {"loaded", large}} {
		fmt.Fprintf(&out, "| %s | %d | %d | %.0f | %.2f | %.0f | %.0f | %.0f | %.0f | %.1f | %.1f |\n", r.name, r.r.Keys, r.r.LedgerRows,
			float64(r.r.FileBytes)/(1<<20), r.r.OpenSeconds, r.r.HotLookupsPerSec, r.r.RandomLookupsPerSec,
			r.r.BoltLookupsPerSec, r.r.InvokesPerSec, float64(r.r.VmRSSKiB)/1024, float64(r.r.VmHWMKiB)/1024)
	}
	hot := pairRatio(func(r scaleResult) float64 { return r.HotLookupsPerSec })
	random := pairRatio(func(r scaleResult) float64 { return r.RandomLookupsPerSec })
	bolt := pairRatio(func(r scaleResult) float64 { return r.BoltLookupsPerSec })
	invokes := pairRatio(func(r scaleResult) float64 { return r.InvokesPerSec })
	fmt.Fprintf(&out, "| loaded / empty (median of the rounds' ratios) | | | | | %s | %s | %s | %s | | |\n", hot, random, bolt, invokes)
	fmt.Fprintf(&out, "loaded process: RssAnon %.1f MiB, RssFile %.1f MiB (pages of the mapped store file)\n",
		float64(large.RssAnonKiB)/1024, float64(large.RssFileKiB)/1024)
	fmt.Print(out.String())

	// Throughput must not collapse with size. The machine is shared and
	// noisy, so the bar is loose: a store of this size that needed more
	// than two reads per lookup, or scanned per call, would fall far below.
	ratioOf := func(s string) float64 { v, _ := strconv.ParseFloat(strings.TrimSuffix(s, "x"), 64); return v }
	if ratioOf(invokes) < 0.5 {
		t.Errorf("invoke metering fell to %s of the empty store's with size", invokes)
	}
	if ratioOf(hot) < 0.5 || ratioOf(bolt) < 0.3 {
		t.Errorf("key lookups fell with size: hot %s, bbolt %s of the empty store's", hot, bolt)
	}
	// Memory stays bounded: the caches are capped, the file is mapped, not
	// read in; what is resident of the mapping is the page cache's to drop.
	if large.RssAnonKiB > 512<<10 {
		t.Errorf("%d MiB of anonymous memory with a loaded store", large.RssAnonKiB>>10)
	}
}

// medianResult takes each figure's median over rounds; memory is the
// largest seen.
func medianResult(rs []scaleResult) scaleResult {
	med := func(f func(scaleResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	out := rs[0]
	out.OpenSeconds = med(func(r scaleResult) float64 { return r.OpenSeconds })
	out.HotLookupsPerSec = med(func(r scaleResult) float64 { return r.HotLookupsPerSec })
	out.RandomLookupsPerSec = med(func(r scaleResult) float64 { return r.RandomLookupsPerSec })
	out.BoltLookupsPerSec = med(func(r scaleResult) float64 { return r.BoltLookupsPerSec })
	out.InvokesPerSec = med(func(r scaleResult) float64 { return r.InvokesPerSec })
	for _, r := range rs {
		out.VmRSSKiB, out.VmHWMKiB = max(out.VmRSSKiB, r.VmRSSKiB), max(out.VmHWMKiB, r.VmHWMKiB)
		out.RssAnonKiB, out.RssFileKiB = max(out.RssAnonKiB, r.RssAnonKiB), max(out.RssFileKiB, r.RssFileKiB)
		out.FileBytes = max(out.FileBytes, r.FileBytes)
	}
	return out
}

// runMeasure measures the store at path in a fresh process.
func runMeasure(t *testing.T, path string, keys, ledger int) scaleResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestScale$", "-test.v", "-test.timeout=30m")
	cmd.Env = append(os.Environ(), "SCALE_MEASURE="+path,
		"SCALE_MEASURE_KEYS="+strconv.Itoa(keys), "SCALE_MEASURE_LEDGER="+strconv.Itoa(ledger))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("measuring %s: %v\n%s", path, err, out)
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "SCALE_RESULT "); ok {
			var r scaleResult
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	t.Fatalf("no result from measuring %s:\n%s", path, out)
	return scaleResult{}
}

var scaleProduct = billing.Product{ID: "scale", BillingModel: billing.Subscription, MeasurementType: billing.PerRequest,
	Quota: ptr(whole(1_000_000_000)), Overage: "block"}

// loadScale writes nKeys service keys and nLedger ledger rows, plus the
// subscriptions the invoke measurement meters to, in large transactions
// straight through the store's own record writers: the loading is not
// what is measured, the store it leaves is.
func loadScale(t *testing.T, path string, nKeys, nLedger int) {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for u := range scaleUsers {
		if _, err := s.PutSubscription(ctx, store.Subscription{UserID: fmt.Sprintf("user-%d", u), ServiceID: "svc",
			ProductID: scaleProduct.ID, Status: "ACTIVE", UpdatedAt: time.Now().Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}

	// Keys: sorted by each bucket's key, so each transaction appends
	// instead of rewriting pages all over the tree.
	type keyRow struct {
		hash [32]byte
		i    int
	}
	rows := make([]keyRow, nKeys)
	for i := range rows {
		rows[i] = keyRow{scaleKeyHash(i), i}
	}
	slices.SortFunc(rows, func(a, b keyRow) int { return bytes.Compare(a.hash[:], b.hash[:]) })
	created := time.Now().UTC().Truncate(time.Second)
	const keyBatch = 50_000
	for from := 0; from < nKeys; from += keyBatch {
		part := rows[from:min(from+keyBatch, nKeys)]
		err := s.update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketKeys)
			b.FillPercent = 0.9
			for _, r := range part {
				k := store.KeyRecord{ID: fmt.Sprintf("key_%08d", r.i), Hash: r.hash,
					UserID: fmt.Sprintf("user-%d", r.i%100_000), Label: "scale", Created: created}
				if err := putJSON(tx, bucketKeys, r.hash[:], toKeyRecord(k)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for from := 0; from < nKeys; from += keyBatch { // key ids in order
		to := min(from+keyBatch, nKeys)
		err := s.update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketKeyIDs)
			b.FillPercent = 0.9
			for i := from; i < to; i++ {
				h := scaleKeyHash(i)
				if err := putRaw(tx, bucketKeyIDs, []byte(fmt.Sprintf("key_%08d", i)), h[:]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	byUser := make([]int, nKeys)
	for i := range byUser {
		byUser[i] = i
	}
	userOf := func(i int) string { return fmt.Sprintf("user-%d", i%100_000) }
	slices.SortFunc(byUser, func(a, b int) int {
		return bytes.Compare(joinKey(userOf(a), fmt.Sprintf("key_%08d", a)), joinKey(userOf(b), fmt.Sprintf("key_%08d", b)))
	})
	for from := 0; from < nKeys; from += keyBatch {
		part := byUser[from:min(from+keyBatch, nKeys)]
		err := s.update(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketKeyUsers)
			b.FillPercent = 0.9
			for _, i := range part {
				h := scaleKeyHash(i)
				if err := putRaw(tx, bucketKeyUsers, joinKey(userOf(i), fmt.Sprintf("key_%08d", i)), h[:]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// Ledger rows over the last 30 days, as the gateway appends them.
	const ledgerBatch = 100_000
	start := time.Now().Add(-30 * 24 * time.Hour)
	step := 30 * 24 * time.Hour / time.Duration(max(nLedger, 1))
	rng := rand.New(rand.NewPCG(1, 2))
	for from := 0; from < nLedger; from += ledgerBatch {
		to := min(from+ledgerBatch, nLedger)
		entries := make([]store.LedgerEntry, 0, to-from)
		for i := from; i < to; i++ {
			u := rng.IntN(100_000)
			entries = append(entries, store.LedgerEntry{Seq: uint64(i + 1), ID: ledgerID(uint64(i + 1)),
				Time: start.Add(time.Duration(i) * step).UTC(), UserID: fmt.Sprintf("user-%d", u),
				ServiceID: "svc", EndpointID: "instant", ProductID: scaleProduct.ID,
				RequestID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, u), Units: whole(1), Source: store.SourceGateway})
		}
		// Into the ledger directory, as the applier appends (its batches
		// are smaller; one block holds at most a few MiB).
		err := s.update(func(tx *bolt.Tx) error {
			for len(entries) > 0 {
				n := min(len(entries), 10_000)
				if err := s.appendLedger(tx, entries[:n], s.led.Position()); err != nil {
					return err
				}
				entries = entries[n:]
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if (from/ledgerBatch)%20 == 19 {
			t.Logf("ledger: %d of %d rows", to, nLedger)
		}
	}
}

// measureScale runs in a process of its own (SCALE_MEASURE=path).
func measureScale(t *testing.T, path string) {
	var r scaleResult
	openStart := time.Now()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r.OpenSeconds = time.Since(openStart).Seconds()
	if fi, err := os.Stat(path); err == nil {
		r.FileBytes = fi.Size()
	}
	// Counted by the loader: counting here would walk every page and make
	// the whole file resident.
	r.Keys, r.LedgerRows = scaleEnvInt("SCALE_MEASURE_KEYS", 0), scaleEnvInt("SCALE_MEASURE_LEDGER", 0)

	rate := func(d time.Duration, n int) float64 { return float64(n) / d.Seconds() }
	const lookups = 200_000
	hot := scaleKeyHash(0)
	begin := time.Now()
	for range 10 * lookups {
		if _, err := s.KeyByHash(ctx, hot); err != nil {
			t.Fatal(err)
		}
	}
	r.HotLookupsPerSec = rate(time.Since(begin), 10*lookups)

	rng := rand.New(rand.NewPCG(3, 4))
	hashes := make([][32]byte, lookups)
	for i := range hashes {
		hashes[i] = scaleKeyHash(rng.IntN(r.Keys))
	}
	begin = time.Now()
	for _, h := range hashes {
		if _, err := s.KeyByHash(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	r.RandomLookupsPerSec = rate(time.Since(begin), lookups)

	begin = time.Now()
	for _, h := range hashes {
		if err := s.view(func(tx *bolt.Tx) error { _, err := readKey(tx, h[:]); return err }); err != nil {
			t.Fatal(err)
		}
	}
	r.BoltLookupsPerSec = rate(time.Since(begin), lookups)

	// Invoke metering: 64 callers for 3 seconds, each on a subscription.
	var calls atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	begin = time.Now()
	for u := range scaleUsers {
		a := store.Account{UserID: fmt.Sprintf("user-%d", u), ServiceID: "svc", Product: scaleProduct}
		wg.Go(func() {
			for time.Now().Before(deadline) {
				now := time.Now()
				res, err := s.Reserve(ctx, a, whole(1), now)
				dec := res.Decision
				if err != nil || !dec.Allowed {
					t.Errorf("Reserve: %+v %v", dec, err)
					return
				}
				if _, err := s.Settle(ctx, res, whole(1), store.LedgerEntry{Time: now, UserID: a.UserID,
					ServiceID: "svc", EndpointID: "instant", ProductID: scaleProduct.ID, Source: store.SourceGateway}); err != nil {
					t.Errorf("Settle: %v", err)
					return
				}
				calls.Add(1)
			}
		})
	}
	wg.Wait()
	r.InvokesPerSec = rate(time.Since(begin), int(calls.Load()))
	r.VmRSSKiB, r.VmHWMKiB, r.RssAnonKiB, r.RssFileKiB = procStatus("VmRSS"), procStatus("VmHWM"),
		procStatus("RssAnon"), procStatus("RssFile")
	b, _ := json.Marshal(r)
	fmt.Printf("SCALE_RESULT %s\n", b)
}

// procStatus reads a kB figure of /proc/self/status.
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			v, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return v
		}
	}
	return 0
}
