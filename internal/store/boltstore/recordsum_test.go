package boltstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"regexp"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// creditsStore writes a store with one prepaid subscription (u1, svc)
// holding credits, and one key, and closes it; it returns the stored text
// of the balance.
func creditsStore(t *testing.T, path string, credits billing.Units) string {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	subscribe(t, s, "u1", "svc", prepaid, credits)
	subscribe(t, s, "u2", "svc", prepaid, credits)
	if err := s.CreateKey(ctx, store.KeyRecord{ID: "key_1", Hash: keyHash("k1"), UserID: "u1", Created: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	text, err := amount(credits).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return `"credits":` + string(text)
}

// patchFile replaces every occurrence of old in the file at path by new
// (the same length), in place, as a damaged disk or a stray write would:
// bbolt keeps earlier copies of a page in free pages, so the live record
// is among them. It fails the test when old is not in the file.
func patchFile(t *testing.T, path string, old, new []byte) {
	t.Helper()
	if len(old) != len(new) {
		t.Fatal("patch changes the length")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, old) {
		t.Fatalf("%s is not in the file", old)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off := 0; ; {
		i := bytes.Index(raw[off:], old)
		if i < 0 {
			break
		}
		if _, err := f.WriteAt(new, int64(off+i)); err != nil {
			t.Fatal(err)
		}
		off += i + len(old)
	}
}

// TestFlippedDigitInBalance changes one digit of a stored balance in the
// file, in place, with the store closed. The value still parses as JSON;
// it must not be read as a balance: reading it fails naming the bucket
// and the record, as damage (ErrDamaged), and store check fails naming
// it. The other subscription, whose record is sound, still reads.
func TestFlippedDigitInBalance(t *testing.T) {
	path := storePath(t)
	stored := creditsStore(t, path, whole(937642))
	flipped := strings.Replace(stored, "9", "1", 1)
	// Only u1's record: u2's is the same text, so patch u1's whole record.
	var u1Rec []byte
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bolt.Tx) error {
		u1Rec = bytes.Clone(tx.Bucket(bucketSubs).Get(subKey("u1", "svc")))
		return nil
	})
	db.Close()
	if !bytes.Contains(u1Rec, []byte(stored)) {
		t.Fatalf("u1's record %q does not hold %s", u1Rec, stored)
	}
	patchFile(t, path, u1Rec, bytes.Replace(u1Rec, []byte(stored), []byte(flipped), 1))

	s := openAt(t, path)
	sub, err := s.GetSubscription(ctx, "u1", "svc")
	if err == nil {
		t.Fatalf("GetSubscription read the damaged record as credits %s", sub.Credits)
	}
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "subscriptions") ||
		!strings.Contains(err.Error(), `user "u1", service "svc"`) {
		t.Fatalf("GetSubscription: %v; want ErrDamaged naming bucket subscriptions and (u1, svc)", err)
	}
	// The damaged balance is never metered against either.
	if _, err := s.Reserve(ctx, store.Account{UserID: "u1", ServiceID: "svc", Product: prepaid}, whole(1), t0); !errors.Is(err, ErrDamaged) {
		t.Errorf("Reserve on the damaged account: %v; want ErrDamaged", err)
	}
	if sub, err := s.GetSubscription(ctx, "u2", "svc"); err != nil || sub.Credits != whole(937642) {
		t.Errorf("u2, whose record is sound: %v credits, %v", sub.Credits, err)
	}
	if _, _, err := s.ListSubscriptions(ctx, "", "", 10); !errors.Is(err, ErrDamaged) {
		t.Errorf("ListSubscriptions over the damaged record: %v; want ErrDamaged", err)
	}
	s.Close()

	_, err = CheckFile(path)
	if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `subscriptions (user "u1", service "svc")`) ||
		!strings.Contains(err.Error(), "1 damaged records") {
		t.Fatalf("CheckFile: %v; want the damaged record named", err)
	}
}

// TestMovedRecordIsDamage copies one user's sound record over another's
// key: the value is a valid sealed record, but not of that key.
func TestMovedRecordIsDamage(t *testing.T) {
	path := storePath(t)
	creditsStore(t, path, whole(5))
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketSubs)
		return b.Put(subKey("u2", "svc"), bytes.Clone(b.Get(subKey("u1", "svc"))))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := openAt(t, path)
	if _, err := s.GetSubscription(ctx, "u2", "svc"); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), `user "u2"`) {
		t.Fatalf("GetSubscription of the moved record: %v; want ErrDamaged naming u2", err)
	}
}

// unsealFile turns a store into what an earlier build wrote: every record
// without its trailer, format 1.
func unsealFile(t *testing.T, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := 0
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range sealedBuckets() {
			b := tx.Bucket(name)
			var keys, vals [][]byte
			err := b.ForEach(func(k, v []byte) error {
				p, err := unseal(name, k, v)
				keys, vals = append(keys, bytes.Clone(k)), append(vals, bytes.Clone(p))
				return err
			})
			if err != nil {
				return err
			}
			for i := range keys {
				if err := b.Put(keys[i], vals[i]); err != nil {
					return err
				}
			}
			n += len(keys)
		}
		return tx.Bucket(bucketMarker).Put(keyFormat, unsealedFormat)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEarlierStoreIsSealedAtOpen opens a store as an earlier build left it
// (no checksums, format 1): store check accepts it and says its records
// are not sealed yet; Open seals every record once and records format 2,
// after which every record reads as before and a flipped digit is caught.
func TestEarlierStoreIsSealedAtOpen(t *testing.T) {
	path := storePath(t)
	stored := creditsStore(t, path, whole(937642))
	n := unsealFile(t, path)
	if n < 5 {
		t.Fatalf("only %d records in the store", n)
	}
	rep, err := CheckFile(path)
	if err != nil || !rep.Unsealed || rep.Records != 0 {
		t.Fatalf("CheckFile of the earlier store: %+v, %v; want OK and unsealed", rep, err)
	}

	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open of the earlier store: %v", err)
	}
	if !strings.Contains(s.sealNote, "records") {
		t.Errorf("no note of the sealing: %q", s.sealNote)
	}
	sub, err := s.GetSubscription(ctx, "u1", "svc")
	if err != nil || sub.Credits != whole(937642) {
		t.Fatalf("GetSubscription after the upgrade: %s, %v", sub.Credits, err)
	}
	if k, err := s.KeyByID(ctx, "key_1"); err != nil || k.UserID != "u1" {
		t.Fatalf("KeyByID after the upgrade: %+v, %v", k, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err = CheckFile(path)
	if err != nil || rep.Unsealed || rep.Records < int64(n) {
		t.Fatalf("CheckFile after the upgrade: %+v, %v; want every record checked", rep, err)
	}
	// A second open seals nothing again.
	s = openAt(t, path)
	if s.sealNote != "" {
		t.Errorf("second Open sealed again: %q", s.sealNote)
	}
	s.Close()

	patchFile(t, path, []byte(stored), []byte(strings.Replace(stored, "9", "1", 1)))
	s = openAt(t, path)
	if sub, err := s.GetSubscription(ctx, "u1", "svc"); !errors.Is(err, ErrDamaged) {
		t.Fatalf("the flipped digit after the upgrade: credits %s, %v; want ErrDamaged", sub.Credits, err)
	}
}

// TestRecordWithoutTrailer puts a record without a checksum into a sealed
// store: it is damage, never read as an earlier build's record.
func TestRecordWithoutTrailer(t *testing.T) {
	path := storePath(t)
	creditsStore(t, path, whole(5))
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSubs).Put(subKey("u1", "svc"),
			[]byte(`{"userId":"u1","serviceId":"svc","productId":"prepaid","status":"ACTIVE","credits":"99999","creditsHeld":"0"}`))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := openAt(t, path)
	if _, err := s.GetSubscription(ctx, "u1", "svc"); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "no checksum") {
		t.Fatalf("GetSubscription of a record without a trailer: %v; want ErrDamaged", err)
	}
	s.Close()
	if _, err := CheckFile(path); !errors.Is(err, ErrDamaged) || !regexp.MustCompile(`subscriptions \(user "u1", service "svc"\): no checksum`).MatchString(err.Error()) {
		t.Fatalf("CheckFile: %v", err)
	}
}

// TestRecordSumIsCRC32C pins the sum to CRC32C of the key's length (4
// bytes, big-endian), the key and the payload, as a reader of the file
// outside this package (e2e/reliability_helpers_test.go) computes it.
func TestRecordSumIsCRC32C(t *testing.T) {
	for _, c := range []struct{ key, payload string }{
		{"", ""}, {"k", ""}, {"", "v"}, {"u1\x00svc", `{"credits":937642}`}, {strings.Repeat("k", 300), strings.Repeat("v", 5000)},
	} {
		var whole []byte
		whole = binary.BigEndian.AppendUint32(whole, uint32(len(c.key)))
		whole = append(append(whole, c.key...), c.payload...)
		if got, want := recordSum([]byte(c.key), []byte(c.payload)), crc32.Checksum(whole, crc32.MakeTable(crc32.Castagnoli)); got != want {
			t.Errorf("recordSum(%.20q, %.20q) = %08x, want %08x", c.key, c.payload, got, want)
		}
	}
}
