package boltstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/platformgw/gateway/internal/store"
)

// filledStore writes a store of a few hundred pages (keys of many users)
// at path through the real Open, closes it and returns the number of keys.
func filledStore(t testing.TB, path string) int {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 32, 60
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("key_%02d_%03d", w, i)
				err := s.CreateKey(ctx, store.KeyRecord{ID: id, Hash: keyHash(id), UserID: fmt.Sprintf("user-%03d", i),
					Label: strings.Repeat("label ", 40), Created: t0})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return writers * each
}

// damage is one way a store file gets broken.
type damage struct {
	name  string
	apply func(t *testing.T, path string)
	want  string // in the error
}

func damages() []damage {
	overwrite := func(seed uint64) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			info, _, err := inspect(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			r := rand.New(rand.NewPCG(seed, seed))
			page := make([]byte, info.PageSize)
			for range 64 {
				for i := range page {
					page[i] = byte(r.Uint32())
				}
				pg := 2 + r.Int64N(int64(info.HighWater)-2)
				if _, err := f.WriteAt(page, pg*int64(info.PageSize)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ds := []damage{
		{"truncated to half", func(t *testing.T, path string) {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, "cut short"},
		{"zero bytes", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}, "the file is empty"},
		{"not a bbolt file", func(t *testing.T, path string) {
			text := bytes.Repeat([]byte("this is a text file, not a database\n"), 2000)
			if err := os.WriteFile(path, text, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "not a bbolt file"},
		{"both meta pages overwritten", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			junk := bytes.Repeat([]byte{0xA5}, 64)
			for _, off := range []int64{16 + 8, 4096 + 16 + 8} { // past magic and version: the checksum fails
				if _, err := f.WriteAt(junk, off); err != nil {
					t.Fatal(err)
				}
			}
		}, "both bbolt meta pages are invalid"},
		{"another application's bbolt file", func(t *testing.T, path string) {
			os.Remove(path)
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket([]byte("widgets"))
				if err != nil {
					return err
				}
				return b.Put([]byte("w1"), []byte("a widget"))
			})
			if err != nil {
				t.Fatal(err)
			}
			db.Close()
		}, "another application"},
		{"a newer store format", func(t *testing.T, path string) {
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMarker).Put(keyFormat, []byte("4")) })
			if err != nil {
				t.Fatal(err)
			}
			db.Close()
		}, `store format "4"`},
	}
	for seed := range uint64(8) {
		ds = append(ds, damage{fmt.Sprintf("64 random pages overwritten (seed %d)", seed), overwrite(seed), "damaged"})
	}
	return ds
}

// TestOpenRefusesDamagedFile breaks copies of a real store in each way an
// attack run found (and a few more) and opens them through Open: each is
// refused with ErrDamaged and an error naming the file and the fault,
// never a panic or a fault, and the file is left as it was.
func TestOpenRefusesDamagedFile(t *testing.T) {
	good := storePath(t)
	filledStore(t, good)
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range damages() {
		t.Run(d.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "platform.db")
			if err := os.WriteFile(path, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			d.apply(t, path)
			before, _ := os.ReadFile(path)
			s, err := Open(path)
			if err == nil {
				s.Close()
				t.Fatal("Open accepted the damaged file")
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), d.want) {
				t.Fatalf("Open: %v; want ErrDamaged naming %s and %q", err, path, d.want)
			}
			t.Log(err)
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Errorf("Open changed the refused file (%d bytes, was %d)", len(after), len(before))
			}
			if _, err := CheckFile(path); !errors.Is(err, ErrDamaged) {
				t.Errorf("CheckFile: %v; want ErrDamaged", err)
			}
		})
	}
}

// TestOpenCreatesOnlyNewPaths: a path that does not exist becomes a new
// store with the marker; a store from before the marker (only our
// buckets) and a bbolt file with no bucket yet are opened and marked.
func TestOpenCreatesOnlyNewPaths(t *testing.T) {
	t.Run("new path", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "sub", "platform.db")
		s := openAt(t, path)
		s.Close()
		if rep, err := CheckFile(path); err != nil || rep.Buckets[string(bucketMarker)] == 0 {
			t.Fatalf("CheckFile of a new store: %+v, %v", rep, err)
		}
	})
	for _, c := range []struct {
		name    string
		buckets [][]byte
	}{
		{"store from before the marker", knownBuckets()},
		{"bbolt file with no bucket", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := storePath(t)
			db, err := bolt.Open(path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				for _, b := range c.buckets {
					if _, err := tx.CreateBucket(b); err != nil {
						return err
					}
				}
				return nil
			})
			db.Close()
			if err != nil {
				t.Fatal(err)
			}
			s := openAt(t, path)
			if err := s.CreateKey(ctx, store.KeyRecord{ID: "key_1", Hash: keyHash("k1"), UserID: "u", Created: t0}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			if rep, err := CheckFile(path); err != nil || rep.Buckets[string(bucketMarker)] == 0 || rep.Buckets[string(bucketKeys)] != 1 {
				t.Fatalf("CheckFile: %+v, %v", rep, err)
			}
		})
	}
}

// TestCheckFile: a sound file is reported with its figures, a path that
// does not exist is an error and is not created, and a file a running
// store holds is ErrLocked, said as such.
func TestCheckFile(t *testing.T) {
	path := storePath(t)
	n := filledStore(t, path)
	rep, err := CheckFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Buckets[string(bucketKeys)] != n || rep.PageSize == 0 || rep.HighWater < 4 || rep.Size < int64(rep.HighWater)*int64(rep.PageSize) {
		t.Errorf("report %+v; want %d keys", rep, n)
	}

	missing := filepath.Join(t.TempDir(), "none.db")
	if _, err := CheckFile(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckFile(missing): %v", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CheckFile created %s", missing)
	}

	defer func(w, c time.Duration) { lockWait, CheckLockWait = w, c }(lockWait, CheckLockWait)
	lockWait, CheckLockWait = 100*time.Millisecond, 100*time.Millisecond
	s := openAt(t, path)
	_, err = CheckFile(path)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "backup") {
		t.Errorf("CheckFile of a file in use: %v; want ErrLocked pointing to a backup", err)
	}
	if _, err := Open(path); !errors.Is(err, ErrLocked) {
		t.Errorf("second Open: %v; want ErrLocked", err)
	}
	s.Close()
}

// TestDamageWhileServing breaks the file under an open store: reads and
// writes that meet the damage get ErrDamaged instead of a panic or a
// fault, and the store stays unusable.
func TestDamageWhileServing(t *testing.T) {
	for _, c := range []struct {
		name  string
		apply func(path string, pageSize int) error
	}{
		{"pages overwritten", func(path string, pageSize int) error {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			st, _ := f.Stat()
			junk := bytes.Repeat([]byte{0xEE}, int(st.Size())-2*pageSize)
			_, err = f.WriteAt(junk, int64(2*pageSize))
			return err
		}},
		{"truncated", func(path string, pageSize int) error {
			return os.Truncate(path, int64(2*pageSize))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := storePath(t)
			n := filledStore(t, path)
			s, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if keys, err := s.ListKeys(ctx, ""); err != nil || len(keys) != n {
				t.Fatalf("ListKeys before the damage: %d, %v", len(keys), err)
			}
			if err := c.apply(path, s.db.Info().PageSize); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ListKeys(ctx, ""); !errors.Is(err, ErrDamaged) {
				t.Fatalf("ListKeys after the damage: %v; want ErrDamaged", err)
			}
			err = s.CreateKey(ctx, store.KeyRecord{ID: "key_new", Hash: keyHash("new"), UserID: "u", Created: t0})
			if !errors.Is(err, ErrDamaged) {
				t.Errorf("CreateKey after the damage: %v; want ErrDamaged", err)
			}
			if _, err := s.KeyByID(ctx, "key_00_000"); !errors.Is(err, ErrDamaged) {
				t.Errorf("KeyByID after the damage: %v; want ErrDamaged", err)
			}
			if err := s.Close(); !errors.Is(err, ErrDamaged) {
				t.Errorf("Close: %v; want ErrDamaged", err)
			}
		})
	}
}
