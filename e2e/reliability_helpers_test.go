package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/ledger"
)

// storeFile is a closed bbolt store file as read with bbolt itself and the
// layout documented in internal/store/boltstore, not through the store's own code:
// what a crash left on disk is judged by a reader that shares none of the
// writer's bugs.
type storeFile struct {
	Ledger       []fileLedgerEntry
	Counters     map[string]fileCounter // user \0 service -> summed over periods
	Reservations []fileReservation
	Jobs         map[string]fileJob
	Subs         map[string]fileSub // user \0 service
	// Digest is a SHA-256 over every bucket's name, sequence, keys and
	// values but the call outcomes' (which count every call, refused ones
	// too, by design): equal digests mean equal stored state.
	Digest string
}

type fileLedgerEntry struct {
	Seq            uint64        `json:"seq"`
	ID             string        `json:"id"`
	Time           time.Time     `json:"time"`
	UserID         string        `json:"userId"`
	ServiceID      string        `json:"serviceId"`
	EndpointID     string        `json:"endpointId"`
	ProductID      string        `json:"productId"`
	RequestID      string        `json:"requestId"`
	Units          billing.Units `json:"units"`
	Overage        billing.Units `json:"overage"`
	Cost           billing.Units `json:"cost"`
	Source         string        `json:"source"`
	IdempotencyKey string        `json:"idempotencyKey"`
	UnitsClaimed   billing.Units `json:"unitsClaimed"`
}

type fileCounter struct {
	Used          billing.Units `json:"used"`
	Reserved      billing.Units `json:"reserved"`
	Spend         billing.Units `json:"spend"`
	ReservedSpend billing.Units `json:"reservedSpend"`
}

type fileReservation struct {
	UserID    string `json:"userId"`
	ServiceID string `json:"serviceId"`
	JobID     string `json:"jobId"`
	Product   struct {
		BillingModel string `json:"billing_model"`
	} `json:"product"`
	Decision struct {
		Units billing.Units `json:"Units"`
		Cost  billing.Units `json:"Cost"`
	} `json:"decision"`
}

type fileJob struct {
	ID            string        `json:"requestId"`
	UserID        string        `json:"userId"`
	ServiceID     string        `json:"serviceId"`
	ProductID     string        `json:"productId"`
	Free          bool          `json:"free"`
	Status        string        `json:"status"`
	Units         billing.Units `json:"units"`
	ReservationID string        `json:"reservationId"`
}

func (j fileJob) open() bool { return j.Status == "PENDING" || j.Status == "RUNNING" }

type fileSub struct {
	ProductID   string
	Status      string
	Credits     billing.Units // may be negative: an overdrawn balance
	CreditsHeld billing.Units
}

// signedUnits reads a stored quantity that may be negative.
func signedUnits(raw json.RawMessage) (billing.Units, error) {
	s := strings.Trim(string(raw), `"`)
	if s == "" || s == "null" {
		return 0, nil
	}
	neg := strings.HasPrefix(s, "-")
	u, err := billing.ParseUnits(strings.TrimPrefix(s, "-"))
	if neg {
		u = -u
	}
	return u, err
}

// accountKey names a subscription in the maps of a storeFile.
func accountKey(user, service string) string { return user + "\x00" + service }

// recordPayload is a record's value without the checksum trailer the
// store ends each with (a mark, a version and the CRC32C of the key's
// length, the key and the value: internal/store/boltstore/recordsum.go),
// or v as it is when the sum does not match (the decoder then fails on
// it, or the test's comparison does).
func recordPayload(k, v []byte) []byte {
	if len(v) < 6 || v[len(v)-6] != 0xFE || v[len(v)-5] != 0x01 {
		return v
	}
	p := v[:len(v)-6]
	tab := crc32.MakeTable(crc32.Castagnoli)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(k)))
	sum := crc32.Update(crc32.Update(crc32.Update(0, tab, n[:]), tab, k), tab, p)
	if sum != binary.BigEndian.Uint32(v[len(v)-4:]) {
		return v
	}
	return p
}

// readStoreFile opens a store file that no process holds and reads it.
func readStoreFile(t *testing.T, path string) storeFile {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open store file %s: %v", path, err)
	}
	defer db.Close()
	sf := storeFile{
		Counters: map[string]fileCounter{},
		Jobs:     map[string]fileJob{},
		Subs:     map[string]fileSub{},
	}
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte("counters")); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				// user \0 service \0 period(8)
				parts := bytes.SplitN(k[:len(k)-8], []byte{0}, 3)
				if len(parts) < 2 {
					return fmt.Errorf("counter key %q", k)
				}
				var c fileCounter
				if err := json.Unmarshal(recordPayload(k, v), &c); err != nil {
					return fmt.Errorf("counter %q: %w", k, err)
				}
				key := accountKey(string(parts[0]), string(parts[1]))
				sum := sf.Counters[key]
				sum.Used += c.Used
				sum.Reserved += c.Reserved
				sum.Spend += c.Spend
				sum.ReservedSpend += c.ReservedSpend
				sf.Counters[key] = sum
				return nil
			}); err != nil {
				return err
			}
		}
		if b := tx.Bucket([]byte("reservations")); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				var r fileReservation
				if err := json.Unmarshal(recordPayload(k, v), &r); err != nil {
					return fmt.Errorf("reservation %x: %w", k, err)
				}
				sf.Reservations = append(sf.Reservations, r)
				return nil
			}); err != nil {
				return err
			}
		}
		// Ended jobs under their ids, open ones (store format 3) in
		// creation order: the same records.
		for _, name := range []string{"jobs", "jobs_live"} {
			b := tx.Bucket([]byte(name))
			if b == nil {
				continue
			}
			if err := b.ForEach(func(k, v []byte) error {
				var j fileJob
				if err := json.Unmarshal(recordPayload(k, v), &j); err != nil {
					return fmt.Errorf("%s %q: %w", name, k, err)
				}
				if _, dup := sf.Jobs[j.ID]; dup {
					return fmt.Errorf("job %s is in the file twice", j.ID)
				}
				sf.Jobs[j.ID] = j
				return nil
			}); err != nil {
				return err
			}
		}
		if b := tx.Bucket([]byte("subscriptions")); b != nil {
			if err := b.ForEach(func(k, v []byte) error {
				var raw struct {
					ProductID   string          `json:"productId"`
					Status      string          `json:"status"`
					Credits     json.RawMessage `json:"credits"`
					CreditsHeld json.RawMessage `json:"creditsHeld"`
				}
				if err := json.Unmarshal(recordPayload(k, v), &raw); err != nil {
					return fmt.Errorf("subscription %q: %w", k, err)
				}
				sub := fileSub{ProductID: raw.ProductID, Status: raw.Status}
				var err error
				if sub.Credits, err = signedUnits(raw.Credits); err != nil {
					return fmt.Errorf("subscription %q credits: %w", k, err)
				}
				if sub.CreditsHeld, err = signedUnits(raw.CreditsHeld); err != nil {
					return fmt.Errorf("subscription %q credits held: %w", k, err)
				}
				sf.Subs[string(k)] = sub
				return nil
			}); err != nil {
				return err
			}
		}
		sum := sha256.New()
		if err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if n := string(name); n != "outcomes" && n != "outcome_writers" {
				digestBucket(sum, name, b)
			}
			return nil
		}); err != nil {
			return err
		}
		sf.Digest = hex.EncodeToString(sum.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatalf("read store file %s: %v", path, err)
	}
	readLedgerDir(t, path, &sf)
	return sf
}

// readLedgerDir reads the ledger directory beside the store file at path
// (through internal/store/ledger, the store's own reader of it) into sf.Ledger, and
// folds every row into sf.Digest.
func readLedgerDir(t *testing.T, path string, sf *storeFile) {
	t.Helper()
	dir := path + ".ledger"
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return
	}
	l, err := ledger.Open(dir, ledger.Options{})
	if err != nil {
		t.Fatalf("open ledger %s: %v", dir, err)
	}
	defer l.Close()
	sum := sha256.New()
	sum.Write([]byte(sf.Digest))
	err = l.Scan(context.Background(), store.LedgerFilter{}, func(e store.LedgerEntry) error {
		raw, err := json.Marshal(e)
		if err != nil {
			return err
		}
		var fe fileLedgerEntry
		if err := json.Unmarshal(raw, &fe); err != nil {
			return fmt.Errorf("ledger row %d: %w", e.Seq, err)
		}
		sf.Ledger = append(sf.Ledger, fe)
		sum.Write(raw)
		return nil
	})
	if err != nil {
		t.Fatalf("read ledger %s: %v", dir, err)
	}
	sf.Digest = hex.EncodeToString(sum.Sum(nil))
}

// digestBucket feeds a bucket's name, sequence and every key and value
// (nested buckets included) into h, each length-prefixed so that no two
// different states hash alike.
func digestBucket(h interface{ Write([]byte) (int, error) }, name []byte, b *bolt.Bucket) {
	var n [8]byte
	put := func(p []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	put(name)
	binary.BigEndian.PutUint64(n[:], b.Sequence())
	h.Write(n[:])
	b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				digestBucket(h, k, nb)
				return nil
			}
		}
		put(k)
		put(v)
		return nil
	})
}

// secretsIn returns which of the needles occur in the file, for the log
// checks: keys, secrets and signatures must never be logged.
func secretsIn(t *testing.T, path string, needles []string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var found []string
	for _, n := range needles {
		if n != "" && strings.Contains(string(data), n) {
			found = append(found, n)
		}
	}
	return found
}
