package boltstore

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrDamaged marks a store file that is not a sound platform store: cut
// short, overwritten, empty, not a bbolt file, or another application's.
// The gateway refuses to open such a file rather than serve from it or
// start afresh over it.
var ErrDamaged = errors.New("store file is damaged or not a platform store")

// ErrLocked is returned when another process holds the store file: a
// running gateway, most likely.
var ErrLocked = errors.New("store file is locked by another process")

// The marker every platform store carries, written when the store is
// created (or first opened by a gateway that knows it): the bucket
// platformgw holds format = storeFormat. A bbolt file of another
// application has other buckets and no marker, and is never mistaken for
// an empty store.
//
// Format 2 is format 1 with a checksum trailer on every record
// (recordsum.go). Open seals a format 1 store (or one from before the
// marker) and records format 2; a gateway that reads format 1 only refuses
// a format 2 file rather than misread its records. Format 3 is format 2
// with the open jobs in their own bucket, in creation order (jobslive.go):
// Open records it on a format 2 store, which needs nothing moved, and a
// gateway that reads format 2 at most refuses the file rather than miss
// its open jobs and their holds.
var (
	bucketMarker   = []byte("platformgw")
	keyFormat      = []byte("format")
	storeFormat    = []byte("3")
	sealedFormat   = []byte("2")
	unsealedFormat = []byte("1")
)

// The on-disk layout of bbolt's meta pages (go.etcd.io/bbolt
// internal/common: page.go and meta.go), read here before bbolt maps the
// file: bbolt trusts the meta page's high-water page id and faults
// (SIGBUS) on a file cut short, and panics on a garbage page. The header
// of a page is id(8) flags(2) count(2) overflow(4); the meta that follows
// is magic(4) version(4) pageSize(4) flags(4) root(8) sequence(8)
// freelist(8) pgid(8) txid(8) checksum(8), in the machine's byte order,
// the checksum being FNV-64a of the meta before it.
const (
	pageHeaderSize = 16
	metaSize       = 64
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	noFreelist     = ^uint64(0)
)

// metaPage is one of the two meta pages of a bbolt file.
type metaPage struct {
	magic, version, pageSize uint32
	root, freelist, pgid     uint64
	txid                     uint64
	checksum, sum            uint64
}

func readMeta(b []byte) metaPage {
	m := b[pageHeaderSize : pageHeaderSize+metaSize]
	e := binary.NativeEndian
	h := fnv.New64a()
	h.Write(m[:56])
	return metaPage{
		magic:    e.Uint32(m[0:]),
		version:  e.Uint32(m[4:]),
		pageSize: e.Uint32(m[8:]),
		root:     e.Uint64(m[16:]),
		freelist: e.Uint64(m[32:]),
		pgid:     e.Uint64(m[40:]),
		txid:     e.Uint64(m[48:]),
		checksum: e.Uint64(m[56:]),
		sum:      h.Sum64(),
	}
}

// problem says what is wrong with a meta page, or "" if it is sound.
func (m metaPage) problem() string {
	switch {
	case m.magic != boltMagic:
		return "no bbolt magic number"
	case m.version != boltVersion:
		return fmt.Sprintf("bbolt format version %d, not %d", m.version, boltVersion)
	case m.checksum != m.sum:
		return "checksum mismatch"
	case m.pageSize < 512 || m.pageSize > 1<<20 || m.pageSize&(m.pageSize-1) != 0:
		return fmt.Sprintf("implausible page size %d", m.pageSize)
	case m.pgid < 4 || m.root >= m.pgid || m.freelist >= m.pgid && m.freelist != noFreelist:
		return fmt.Sprintf("root page %d or freelist page %d above the high-water page %d", m.root, m.freelist, m.pgid)
	}
	return ""
}

// FileInfo is what the meta page in use says about a store file.
type FileInfo struct {
	Size      int64  // bytes
	PageSize  int    // bytes
	HighWater uint64 // pages in use, the meta page's pgid
	TxID      uint64 // last committed transaction
}

// damaged builds the error for a file that must not be opened.
func damaged(path, format string, args ...any) error {
	return fmt.Errorf("store %s: %s: %w", path, fmt.Sprintf(format, args...), ErrDamaged)
}

// inspect reads the meta pages of the store file at path, the way bbolt
// picks the one in use (the valid one with the highest transaction id),
// and checks that the file holds every page that meta page counts. A path
// that does not exist is a new store (exists false); an existing file,
// even an empty one, must be a sound bbolt file.
func inspect(path string) (info FileInfo, exists bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return info, false, nil
	}
	if err != nil {
		return info, false, fmt.Errorf("store %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return info, true, fmt.Errorf("store %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return info, true, damaged(path, "not a regular file")
	}
	info.Size = st.Size()
	if info.Size == 0 {
		return info, true, damaged(path, "the file is empty (0 bytes); an existing file is never started afresh, only a path that does not exist is; restore the store from a backup (or delete the file, its .ledger directory and its settlement log segments to start an empty store on purpose)")
	}
	// The first meta page tells the page size; a torn first page leaves
	// the second at bbolt's default (the OS page size) or another power of
	// two, which is where bbolt looks for it too.
	head := make([]byte, pageHeaderSize+metaSize)
	var metas []metaPage
	var problems []string
	if n, _ := f.ReadAt(head, 0); n < len(head) {
		return info, true, damaged(path, "only %d bytes, shorter than a bbolt meta page: not a bbolt file", info.Size)
	}
	m0 := readMeta(head)
	if p := m0.problem(); p == "" {
		metas = append(metas, m0)
	} else {
		problems = append(problems, "meta page 0: "+p)
	}
	sizes := []int64{int64(os.Getpagesize()), 4096}
	if len(metas) == 1 {
		sizes = []int64{int64(m0.pageSize)}
	} else {
		for s := int64(512); s <= 1<<16; s *= 2 {
			sizes = append(sizes, s)
		}
	}
	for _, ps := range sizes {
		if n, _ := f.ReadAt(head, ps); n < len(head) {
			continue
		}
		m1 := readMeta(head)
		if m1.problem() == "" && int64(m1.pageSize) == ps {
			metas = append(metas, m1)
			break
		} else if len(metas) == 1 {
			problems = append(problems, "meta page 1: "+m1.problem())
		}
	}
	if len(metas) == 0 {
		if m0.magic != boltMagic {
			return info, true, damaged(path, "not a bbolt file (no bbolt magic number in its meta pages)")
		}
		if len(problems) == 1 {
			problems = append(problems, "meta page 1: not found or invalid")
		}
		return info, true, damaged(path, "both bbolt meta pages are invalid (%s)", strings.Join(problems, "; "))
	}
	m := slices.MaxFunc(metas, func(a, b metaPage) int { return cmp.Compare(a.txid, b.txid) })
	info.PageSize = int(m.pageSize)
	info.HighWater = m.pgid
	info.TxID = m.txid
	if need := int64(m.pgid) * int64(m.pageSize); info.Size < need {
		return info, true, damaged(path, "cut short: %d bytes, but its meta page (transaction %d) counts %d pages of %d bytes (%d bytes)",
			info.Size, m.txid, m.pgid, m.pageSize, need)
	}
	if m.freelist != noFreelist {
		if p := freelistProblem(f, m); p != "" {
			return info, true, damaged(path, "freelist page %d: %s", m.freelist, p)
		}
	}
	return info, true, nil
}

// freelistProblem says what is wrong with the freelist page of m, or "".
// bbolt reads that page while it opens the file, before any check can run,
// and a panic there would leave the file mapped and locked.
func freelistProblem(f *os.File, m metaPage) string {
	hdr := make([]byte, pageHeaderSize+8)
	if n, _ := f.ReadAt(hdr, int64(m.freelist)*int64(m.pageSize)); n < len(hdr) {
		return "cannot be read"
	}
	e := binary.NativeEndian
	id, flags, count, overflow := e.Uint64(hdr), e.Uint16(hdr[8:]), uint64(e.Uint16(hdr[10:])), uint64(e.Uint32(hdr[12:]))
	const freelistPageFlag, bigCount = 0x10, 0xFFFF
	switch {
	case id != m.freelist:
		return fmt.Sprintf("identifies as page %d", id)
	case flags != freelistPageFlag:
		return fmt.Sprintf("flags %#x, not a freelist page", flags)
	case m.freelist+overflow >= m.pgid:
		return fmt.Sprintf("%d overflow pages run past the high-water page %d", overflow, m.pgid)
	}
	if count == bigCount {
		count = e.Uint64(hdr[pageHeaderSize:]) + 1 // the count is the first element
	}
	if room := (overflow+1)*uint64(m.pageSize) - pageHeaderSize; count > room/8 {
		return fmt.Sprintf("%d free page ids do not fit in %d pages", count, overflow+1)
	}
	return ""
}

// pageFault is a panic or memory fault bbolt had on a damaged page.
type pageFault struct{ cause any }

func (f *pageFault) Error() string { return fmt.Sprintf("bbolt failed on a damaged page: %v", f.cause) }

// isFault tells whether err is (or wraps) a pageFault from guard.
func isFault(err error) bool {
	var f *pageFault
	return errors.As(err, &f)
}

// guard runs fn with a fault on the mapped file (SIGBUS past its end,
// SIGSEGV on a wild page id) turned into a panic, and a panic (bbolt's
// assertions on a garbage page) into an error. Only fn's goroutine is
// guarded: what fn starts must guard itself.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &pageFault{r}
		}
	}()
	return fn()
}

// verify checks the open file: every bucket and key is read (guarded, so a
// wild page pointer is an error here, before bbolt's own check reads the
// same pages unguarded), then bbolt's consistency check (tx.Check), then
// the layout: the marker, or for a file from before it, only the
// platform's buckets.
func verify(db *bolt.DB, path string) error {
	return db.View(func(tx *bolt.Tx) error {
		err := guard(func() error {
			return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(b) })
		})
		if err != nil {
			return damaged(path, "%v", err)
		}
		var problems []string
		for err := range tx.Check() {
			if len(problems) < 5 {
				problems = append(problems, err.Error())
			}
		}
		if len(problems) > 0 {
			return damaged(path, "bbolt's consistency check failed: %s", strings.Join(problems, "; "))
		}
		if _, err := layout(tx, path); err != nil {
			return err
		}
		return nil
	})
}

// walk reads every key and value of b and its nested buckets.
func walk(b *bolt.Bucket) error {
	return b.ForEach(func(k, v []byte) error {
		if v == nil {
			if nb := b.Bucket(k); nb != nil {
				return walk(nb)
			}
		}
		return nil
	})
}

// layout tells whether tx's file is a platform store: it carries the
// marker (fresh false), or is a store from before the marker (only the
// platform's buckets, among them keys and ledger; fresh false, the marker
// is added on open), or has no bucket at all (fresh true: a file bbolt
// created but no gateway filled yet).
func layout(tx *bolt.Tx, path string) (fresh bool, err error) {
	if m := tx.Bucket(bucketMarker); m != nil {
		if v := m.Get(keyFormat); string(v) != string(storeFormat) && string(v) != string(sealedFormat) && string(v) != string(unsealedFormat) {
			return false, damaged(path, "store format %q, but this gateway reads formats %q, %q and %q", v, unsealedFormat, sealedFormat, storeFormat)
		}
		return false, nil
	}
	var names, foreign []string
	err = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		names = append(names, string(name))
		if !slices.ContainsFunc(knownBuckets(), func(b []byte) bool { return string(b) == string(name) }) {
			foreign = append(foreign, string(name))
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if len(names) == 0 {
		return true, nil
	}
	if len(foreign) > 0 || !slices.Contains(names, string(bucketKeys)) || !slices.Contains(names, string(bucketLedger)) {
		return false, damaged(path, "a bbolt file of another application (buckets %s, no platform store marker)", strings.Join(names, ", "))
	}
	return false, nil
}

// CheckLockWait is how long CheckFile waits for a lock another process
// holds before it says the file is in use.
var CheckLockWait = time.Second

// Report is what CheckFile found in a sound store file.
type Report struct {
	FileInfo
	// Buckets counts the entries of each top-level bucket.
	Buckets map[string]int
	// LedgerRows counts the rows of the ledger directory beside the file
	// (LedgerDir), every one read and its checksum checked.
	LedgerRows int64
	// Records counts the records whose checksum was checked (every record
	// of the sealed buckets, recordsum.go); Unsealed is set instead for a
	// store of an earlier build, whose records have none yet (the next
	// start adds them).
	Records  int64
	Unsealed bool
	// Cross is the check of the counters against the ledger and the
	// stored holds (crossCheck).
	Cross CrossCheck
}

// maxDamagedRecords bounds how many damaged records an error names.
const maxDamagedRecords = 20

// CheckFile verifies the store file at path without a running gateway:
// its meta pages and size, every page it references, bbolt's consistency
// check and the platform layout, then every row of the ledger directory
// beside it (LedgerDir). It opens the file read-only and never creates or
// changes it (opening the ledger finishes what a crash left there, as a
// start would); a file a running gateway holds is ErrLocked.
func CheckFile(path string) (Report, error) {
	info, exists, err := inspect(path)
	if err != nil {
		return Report{}, err
	}
	if !exists {
		return Report{}, fmt.Errorf("store %s: %w", path, os.ErrNotExist)
	}
	rep := Report{FileInfo: info, Buckets: map[string]int{}}
	var db *bolt.DB
	var file *os.File
	err = guard(func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: CheckLockWait,
			OpenFile: func(name string, flag int, perm os.FileMode) (f *os.File, err error) {
				file, err = os.OpenFile(name, flag&^os.O_CREATE, perm)
				return file, err
			}})
		return err
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return rep, fmt.Errorf("store %s: %w (a running gateway?); check a backup instead: caddy platform store backup --output copy.db", path, ErrLocked)
	}
	if isFault(err) && file != nil {
		file.Close()
	}
	if err != nil {
		return rep, damaged(path, "bbolt cannot open it: %v", err)
	}
	defer db.Close()
	if err := verify(db, path); err != nil {
		return rep, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			rep.Buckets[string(name)] = b.Stats().KeyN
			return nil
		})
	})
	if err != nil {
		return rep, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMarker); m == nil || string(m.Get(keyFormat)) != string(storeFormat) && string(m.Get(keyFormat)) != string(sealedFormat) {
			rep.Unsealed = true
			return nil
		}
		bad, nbad, n := checkRecords(tx, maxDamagedRecords)
		rep.Records = n
		if nbad > 0 {
			return damagedRecords(path, bad, nbad)
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	var seq, applied uint64
	db.View(func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMarker); m != nil {
			seq, applied = markerU64(m, keyLedgerSeq), markerU64(m, keySettled)
		}
		if tx.Bucket(bucketLedger) != nil {
			applied = 0 // the ledger is still (partly) in the file: the next start moves it
		}
		return nil
	})
	if _, err := os.Stat(LedgerDir(path)); errors.Is(err, os.ErrNotExist) && seq > 0 {
		return rep, fmt.Errorf("store %s: its ledger directory %s is missing (the file has %d ledger rows numbered): the store does not start without it; restore both from the same backup",
			path, LedgerDir(path), seq)
	}
	rep.LedgerRows, rep.Cross, err = checkLedgerAgainst(path, applied, db, seq)
	if err == nil && len(rep.Cross.Mismatches) > 0 {
		err = disagree(path, rep.Cross.Mismatches)
	}
	return rep, err
}

// damagedRecords is the error for records whose checksum failed: each
// named (bucket and key), at most maxDamagedRecords of them.
func damagedRecords(path string, bad []error, n int64) error {
	lines := make([]string, len(bad))
	for i, err := range bad {
		var re *RecordError
		if errors.As(err, &re) {
			lines[i] = fmt.Sprintf("%s %s: %s", re.Bucket, describeKey(re.Bucket, re.Key), re.Problem)
		} else {
			lines[i] = err.Error()
		}
	}
	more := ""
	if n > int64(len(bad)) {
		more = fmt.Sprintf(", the first %d named", len(bad))
	}
	return damaged(path, "%d damaged records%s (their bytes changed after they were written; restore a backup):\n  %s",
		n, more, strings.Join(lines, "\n  "))
}

// Unusable is a store that answers every call with err: what a gateway
// serves from when its store file could not be opened.
func Unusable(path string, err error) *Store {
	s := &Store{path: path, closing: make(chan struct{}), loopDone: make(chan struct{}), cache: newReadCache()}
	s.closeOnce.Do(func() { close(s.closing) })
	close(s.loopDone)
	s.failure.Store(&err)
	return s
}
