package boltstore

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLedgerSegmentDamageNamed: a raw ledger segment damaged (a byte
// changed in its middle) or truncated after the store file recorded what it
// holds is refused, by Open and by CheckFile, with an error that names the
// segment, the offset and the fault. It is not taken for a torn write (the
// rows it held were acknowledged) nor reported as a directory older than
// the file, and the segment is left as it was for the operator to restore.
func TestLedgerSegmentDamageNamed(t *testing.T) {
	cases := []struct {
		name   string
		damage func(t *testing.T, seg string, size int64)
		fault  string
	}{
		{"byte changed in the middle", func(t *testing.T, seg string, size int64) { flip(t, seg, size/2) }, "bad checksum"},
		{"byte changed in the last block", func(t *testing.T, seg string, size int64) { flip(t, seg, size-20) }, "bad checksum"},
		{"truncated", func(t *testing.T, seg string, size int64) {
			if err := os.Truncate(seg, size/2); err != nil {
				t.Fatal(err)
			}
		}, "truncated block"},
		{"truncated inside its header", func(t *testing.T, seg string, size int64) {
			if err := os.Truncate(seg, 10); err != nil {
				t.Fatal(err)
			}
		}, "truncated segment header"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := storePath(t)
			s := openAt(t, path)
			a := subscribe(t, s, "u1", "svc", unlimited, 0)
			// Four applies: four blocks, so the middle of the file has
			// whole blocks after it.
			for i := range 20 {
				if _, err := s.Record(ctx, a, entryFor(a, whole(1), t0.Add(time.Duration(i)*time.Second)), okResponse); err != nil {
					t.Fatal(err)
				}
				if i%5 == 4 {
					if err := s.applyAll(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			segs, err := filepath.Glob(filepath.Join(LedgerDir(path), "seg-*.raw"))
			if err != nil || len(segs) == 0 {
				t.Fatalf("no raw segment: %v %v", segs, err)
			}
			seg := segs[len(segs)-1]
			fi, err := os.Stat(seg)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() < 200 {
				t.Fatalf("segment %s holds %d bytes: the rows are not in it", seg, fi.Size())
			}
			tc.damage(t, seg, fi.Size())
			damaged, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}

			refused := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s opened a store with a damaged ledger segment", what)
				}
				msg := err.Error()
				t.Logf("%s: %s", what, msg)
				for _, want := range []string{seg, "offset", tc.fault} {
					if !strings.Contains(msg, want) {
						t.Errorf("%s: %q does not say %q", what, msg, want)
					}
				}
				if strings.Contains(msg, "older than the file") {
					t.Errorf("%s: %q calls damage an older directory", what, msg)
				}
				// Nothing was dropped: the operator restores the file as it is.
				if now, err := os.ReadFile(seg); err != nil || !bytes.Equal(now, damaged) {
					t.Errorf("%s changed the damaged segment: %d bytes, was %d (%v)", what, len(now), len(damaged), err)
				}
			}
			s2, err := Open(path)
			if err == nil {
				s2.Close()
			}
			refused("Open", err)
			_, err = CheckFile(path)
			refused("CheckFile", err)
		})
	}
}

// flip changes the byte at off of the file at path.
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x5a
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
