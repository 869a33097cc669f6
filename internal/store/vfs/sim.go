package vfs

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Sim is a simulated disk in memory for the storage simulation: files as
// a process sees them (the page cache) and as they are on the platter,
// apart. A write changes what reads see and marks its pages dirty; a
// successful sync copies the dirty pages (and the size) to the platter; a
// crash (Crash) throws the page cache away and keeps, of each file's
// unsynced changes, a random subset of its dirty pages and either size:
// what power loss leaves (whole writes lost, torn ones, zeros where the
// file grew). Creations, renames and removals are durable once their
// directory is synced; a crash keeps a random prefix of the ones that are
// not (an ordered metadata journal).
//
// Faults are injected at the rates of Faults, and every decision is a
// function of the seed, the file's path (below the root, SetRoot), what is
// decided and how many operations that path has seen: the same seed and
// the same operations per file give the same faults, whatever the
// goroutines' interleaving and wherever the disk is mounted.
//
// Power can also fail in the middle of an operation (Faults.Crash): the
// operation does part of what it does (a prefix of a write, some pages of
// a sync, a rename or not), the disk crashes as Crash does, and the
// operation and every later one of that process fail with ErrCrashed.
//
// Directories are kept as a set and are durable at once; there are no
// permissions, links or modification times.
type Sim struct {
	mu      sync.Mutex
	seed    uint64
	faults  Faults
	root    string // the prefix the fault decisions leave out of a path
	gen     uint64 // bumped by Crash: handles of older generations are dead
	crashes uint64
	dirs    map[string]bool
	files   map[string]*inode // the names the running process sees
	durable map[string]*inode // the names a crash keeps
	pending []nsOp            // name changes not yet durable, in order
	ops     map[string]uint64 // operations per path, for the fault decisions
	stats   SimStats
}

// Faults are the rates, in parts per 10,000 operations of their kind, of
// the faults a Sim injects. The zero value injects none; crashes are the
// caller's (Crash).
type Faults struct {
	// WriteErr: a write fails with EIO after writing a prefix of its
	// bytes (a torn write the process sees).
	WriteErr int
	// NoSpace: a write fails with ENOSPC after writing a prefix.
	NoSpace int
	// SyncErr: an fsync or fdatasync fails with EIO. As on Linux
	// (PostgreSQL's "fsyncgate"), the dirty pages it covered are marked
	// clean anyway: some reached the disk, the rest are lost, and the next
	// sync reports success without writing them.
	SyncErr int
	// Slow: an operation sleeps up to a millisecond first, which
	// reorders the store's background work against its callers (when it
	// runs on goroutines of its own).
	Slow int
	// Crash: power fails during the operation (any operation of a file
	// or a directory): it does a random part of what it does, the disk
	// crashes (as Crash), and it fails with ErrCrashed, as every later
	// operation of the process does.
	Crash int

	// The damage faults: no code can avoid what they do, only detect it.

	// LostWrite: a write reports success and changes what reads see, and
	// never reaches the disk (a firmware that drops it).
	LostWrite int
	// BitFlip: at a crash, one bit of a file on the disk flips (per crash).
	BitFlip int
	// Misread: a read returns, for part of what it asked, bytes from
	// another offset of the file (a misdirected read; the file is fine).
	Misread int
}

// SimStats counts what a Sim did.
type SimStats struct {
	Ops, Writes, Syncs, Crashes, MidCrashes                int64
	WriteErrs, NoSpaces, SyncErrs, Slows                   int64
	LostWrites, BitFlips, Misreads, TornPages, LostRenames int64
}

// ErrCrashed is what a file or file system handle of before a crash
// returns: the process that held it is gone.
var ErrCrashed = errors.New("simulated crash: the process that opened this is gone")

const simPage = 4096

type inode struct {
	data  []byte         // what reads see
	disk  []byte         // what a crash keeps, before its own losses
	dirty map[int64]bool // pages written since they were last synced
}

type nsOp struct {
	dir   string
	apply func(names map[string]*inode)
}

// NewSim is an empty disk whose faults are decided by seed.
func NewSim(seed uint64, f Faults) *Sim {
	return &Sim{seed: seed, faults: f, dirs: map[string]bool{"/": true}, files: map[string]*inode{},
		durable: map[string]*inode{}, ops: map[string]uint64{}}
}

// FS is the file system as the process running now sees it; a Crash ends
// it (every later call returns ErrCrashed) and FS must be called again.
func (s *Sim) FS() FS {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &simFS{s: s, gen: s.gen}
}

// SetRoot makes the fault decisions see paths below dir as relative to
// it: a run in another temporary directory meets the same faults.
func (s *Sim) SetRoot(dir string) {
	s.mu.Lock()
	s.root = filepath.Clean(dir) + string(filepath.Separator)
	s.mu.Unlock()
}

// rel is path below the root ("." for the root itself).
func (s *Sim) rel(path string) string {
	if path+string(filepath.Separator) == s.root {
		return "."
	}
	return strings.TrimPrefix(path, s.root)
}

// Crashes is how many times the disk has crashed (by Crash or during an
// operation): a caller that sees it grow knows its process is gone.
func (s *Sim) Crashes() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashes
}

// Digest is a hash of the whole disk: every file's name (below the root),
// the bytes a process reads, the bytes on the platter, its dirty pages, and
// the name changes not yet durable. Two runs of one seed that end with
// the same digest left the same disk, bit for bit.
func (s *Sim) Digest() [sha256.Size]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := sha256.New()
	put := func(b []byte) {
		h.Write(binary.AppendUvarint(nil, uint64(len(b))))
		h.Write(b)
	}
	for _, view := range []map[string]*inode{s.files, s.durable} {
		for _, name := range slices.Sorted(maps.Keys(view)) {
			ino := view[name]
			put([]byte(s.rel(name)))
			put(ino.data)
			put(ino.disk)
			for _, p := range slices.Sorted(maps.Keys(ino.dirty)) {
				h.Write(binary.AppendUvarint(nil, uint64(p)))
			}
		}
		put(nil)
	}
	for _, op := range s.pending {
		put([]byte(s.rel(op.dir)))
	}
	return [sha256.Size]byte(h.Sum(nil))
}

// Stats returns the counts so far.
func (s *Sim) Stats() SimStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// SetFaults changes the fault rates (say, none while a test checks what a
// recovery left).
func (s *Sim) SetFaults(f Faults) {
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
}

// decide draws the n-th decision of kind for path: a value in [0, 10000)
// and more bits for the fault's details.
func (s *Sim) decide(kind, path string) (int, uint64) {
	path = s.rel(path)
	s.ops[path]++
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00%s\x00%s\x00%d", s.seed, kind, path, s.ops[path])
	r := rand.New(rand.NewPCG(s.seed, h.Sum64()))
	return r.IntN(10000), r.Uint64()
}

// slow sleeps for an operation on path at the Slow rate (s.mu held: the
// whole disk is slow meanwhile, as one device is).
func (s *Sim) slow(path string) {
	s.stats.Ops++
	if s.faults.Slow == 0 {
		return
	}
	if p, bits := s.decide("slow", path); p < s.faults.Slow {
		s.stats.Slows++
		time.Sleep(time.Duration(bits%1000) * time.Microsecond)
	}
}

// Crash is a power loss: every handle dies, and the disk keeps what the
// rules of Sim say (its faults included). The choices are drawn from the
// seed and the number of the crash.
func (s *Sim) Crash() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.crash()
}

// crash is Crash with s.mu held.
func (s *Sim) crash() {
	s.gen++
	s.crashes++
	s.stats.Crashes++
	r := rand.New(rand.NewPCG(s.seed, s.crashes))
	keep := r.IntN(len(s.pending) + 1)
	for _, op := range s.pending[:keep] {
		op.apply(s.durable)
	}
	s.stats.LostRenames += int64(len(s.pending) - keep)
	s.pending = nil
	images := map[*inode]*inode{}
	names := slices.Sorted(maps.Keys(s.durable))
	for _, name := range names {
		old := s.durable[name]
		img, ok := images[old]
		if !ok {
			img = old.crashImage(r, &s.stats)
			images[old] = img
		}
		s.durable[name] = img
	}
	if s.faults.BitFlip > 0 && r.IntN(10000) < s.faults.BitFlip && len(names) > 0 {
		ino := s.durable[names[r.IntN(len(names))]]
		if len(ino.disk) > 0 {
			i := r.IntN(len(ino.disk))
			ino.disk[i] ^= 1 << r.IntN(8)
			ino.data[i] = ino.disk[i]
			s.stats.BitFlips++
		}
	}
	s.files = maps.Clone(s.durable)
}

// crashImage is what a crash leaves of ino: the disk's bytes, the size
// either the disk's or the page cache's, and each dirty page either
// written or not.
func (ino *inode) crashImage(r *rand.Rand, st *SimStats) *inode {
	size := len(ino.disk)
	if len(ino.data) != size && r.IntN(2) == 0 {
		size = len(ino.data)
	}
	img := make([]byte, size)
	copy(img, ino.disk)
	for _, p := range slices.Sorted(maps.Keys(ino.dirty)) {
		lo := p * simPage
		if lo >= int64(size) || lo >= int64(len(ino.data)) {
			continue
		}
		if r.IntN(2) == 0 {
			st.TornPages++
			continue
		}
		copy(img[lo:min(lo+simPage, int64(size))], ino.data[lo:min(lo+simPage, int64(len(ino.data)))])
	}
	return &inode{data: img, disk: slices.Clone(img), dirty: map[int64]bool{}}
}

// sync makes ino's dirty pages and size durable; failed (fsyncgate) keeps
// some pages and drops the rest, clean either way.
func (ino *inode) sync(failed bool, bits uint64) {
	if !failed || bits&1 == 0 {
		if len(ino.disk) < len(ino.data) {
			ino.disk = append(ino.disk, make([]byte, len(ino.data)-len(ino.disk))...)
		}
		ino.disk = ino.disk[:len(ino.data)]
	}
	for _, p := range slices.Sorted(maps.Keys(ino.dirty)) {
		bits = bits>>1 | bits<<63
		if failed && bits&1 == 0 {
			continue // lost: clean in the cache, never on the disk
		}
		lo := p * simPage
		if lo < int64(len(ino.disk)) && lo < int64(len(ino.data)) {
			copy(ino.disk[lo:min(lo+simPage, int64(len(ino.disk)))], ino.data[lo:min(lo+simPage, int64(len(ino.data)))])
		}
	}
	clear(ino.dirty)
}

// write puts b at off, marking its pages dirty unless the write is lost.
func (ino *inode) write(b []byte, off int64, lost bool) {
	if end := off + int64(len(b)); end > int64(len(ino.data)) {
		ino.data = append(ino.data, make([]byte, end-int64(len(ino.data)))...)
	}
	copy(ino.data[off:], b)
	if lost || len(b) == 0 {
		return
	}
	for p := off / simPage; p <= (off+int64(len(b))-1)/simPage; p++ {
		ino.dirty[p] = true
	}
}

func (ino *inode) truncate(n int64) {
	old := int64(len(ino.data))
	if n < old {
		ino.data = ino.data[:n]
		if n%simPage != 0 {
			ino.dirty[n/simPage] = true
		}
		return
	}
	ino.write(make([]byte, n-old), old, false)
}

// simFS is the disk as one process (generation) sees it.
type simFS struct {
	s   *Sim
	gen uint64
}

func pathErr(op, path string, err error) error { return &os.PathError{Op: op, Path: path, Err: err} }

// lock takes the disk's lock, or says the process is gone. cut says that
// power fails during this operation (Faults.Crash): the operation does the
// part of its work that bits choose and returns powerFail.
func (v *simFS) lock(op, path string) (cut bool, bits uint64, err error) {
	v.s.mu.Lock()
	if v.s.gen != v.gen {
		v.s.mu.Unlock()
		return false, 0, pathErr(op, path, ErrCrashed)
	}
	v.s.slow(path)
	if v.s.faults.Crash > 0 {
		var p int
		p, bits = v.s.decide("crash", path)
		cut = p < v.s.faults.Crash
	}
	return cut, bits, nil
}

// powerFail crashes the disk during an operation on path (s.mu held).
func (s *Sim) powerFail(op, path string) error {
	s.stats.MidCrashes++
	s.crash()
	return pathErr(op, path, ErrCrashed)
}

func (v *simFS) OpenFile(name string, flag int, _ os.FileMode) (File, error) {
	name = filepath.Clean(name)
	cut, bits, err := v.lock("open", name)
	if err != nil {
		return nil, err
	}
	s := v.s
	defer s.mu.Unlock()
	if cut && bits&1 == 0 {
		return nil, s.powerFail("open", name) // before the creation
	}
	if !s.dirs[filepath.Dir(name)] {
		return nil, pathErr("open", name, syscall.ENOENT)
	}
	ino, ok := s.files[name]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, pathErr("open", name, syscall.EEXIST)
	case !ok && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, syscall.ENOENT)
	case !ok:
		ino = &inode{dirty: map[int64]bool{}}
		s.files[name] = ino
		s.pending = append(s.pending, nsOp{filepath.Dir(name), func(m map[string]*inode) { m[name] = ino }})
	}
	if flag&os.O_TRUNC != 0 {
		ino.truncate(0)
	}
	if cut {
		return nil, s.powerFail("open", name) // after it
	}
	acc := flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	return &simFile{v: v, path: name, ino: ino, app: flag&os.O_APPEND != 0,
		rd: acc != os.O_WRONLY, wr: acc != os.O_RDONLY}, nil
}

func (v *simFS) ReadFile(name string) ([]byte, error) {
	name = filepath.Clean(name)
	cut, _, err := v.lock("read", name)
	if err != nil {
		return nil, err
	}
	defer v.s.mu.Unlock()
	if cut {
		return nil, v.s.powerFail("read", name)
	}
	ino, ok := v.s.files[name]
	if !ok {
		return nil, pathErr("read", name, syscall.ENOENT)
	}
	b := slices.Clone(ino.data)
	v.s.misread(name, ino, b, 0)
	return b, nil
}

// misread replaces, at the Misread rate, part of b (read at off) by the
// bytes of another offset of the file.
func (s *Sim) misread(path string, ino *inode, b []byte, off int64) {
	if s.faults.Misread == 0 || len(b) == 0 || len(ino.data) == 0 {
		return
	}
	p, bits := s.decide("misread", path)
	if p >= s.faults.Misread {
		return
	}
	s.stats.Misreads++
	at := int(bits % uint64(len(b)))
	from := int((bits >> 32) % uint64(len(ino.data)))
	n := min(simPage, len(b)-at, len(ino.data)-from)
	if from == int(off)+at {
		from = (from + simPage) % len(ino.data)
		n = min(n, len(ino.data)-from)
	}
	copy(b[at:at+n], ino.data[from:from+n])
}

func (v *simFS) ReadDir(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	cut, _, err := v.lock("readdir", dir)
	if err != nil {
		return nil, err
	}
	defer v.s.mu.Unlock()
	if cut {
		return nil, v.s.powerFail("readdir", dir)
	}
	if !v.s.dirs[dir] {
		return nil, pathErr("readdir", dir, syscall.ENOENT)
	}
	var names []string
	for p := range v.s.files {
		if filepath.Dir(p) == dir {
			names = append(names, filepath.Base(p))
		}
	}
	slices.Sort(names)
	return names, nil
}

func (v *simFS) Rename(from, to string) error {
	from, to = filepath.Clean(from), filepath.Clean(to)
	cut, bits, err := v.lock("rename", from)
	if err != nil {
		return err
	}
	s := v.s
	defer s.mu.Unlock()
	if cut && bits&1 == 0 {
		return s.powerFail("rename", from)
	}
	ino, ok := s.files[from]
	if !ok {
		return pathErr("rename", from, syscall.ENOENT)
	}
	if filepath.Dir(from) != filepath.Dir(to) {
		return pathErr("rename", from, syscall.EXDEV) // not needed by the store
	}
	s.files[to] = ino
	delete(s.files, from)
	s.pending = append(s.pending, nsOp{filepath.Dir(to), func(m map[string]*inode) {
		m[to] = ino
		delete(m, from)
	}})
	if cut {
		return s.powerFail("rename", from)
	}
	return nil
}

func (v *simFS) Remove(name string) error {
	name = filepath.Clean(name)
	cut, bits, err := v.lock("remove", name)
	if err != nil {
		return err
	}
	s := v.s
	defer s.mu.Unlock()
	if cut && bits&1 == 0 {
		return s.powerFail("remove", name)
	}
	if _, ok := s.files[name]; !ok {
		return pathErr("remove", name, syscall.ENOENT)
	}
	delete(s.files, name)
	s.pending = append(s.pending, nsOp{filepath.Dir(name), func(m map[string]*inode) { delete(m, name) }})
	if cut {
		return s.powerFail("remove", name)
	}
	return nil
}

func (v *simFS) MkdirAll(dir string) error {
	dir = filepath.Clean(dir)
	cut, _, err := v.lock("mkdir", dir)
	if err != nil {
		return err
	}
	defer v.s.mu.Unlock()
	if cut {
		return v.s.powerFail("mkdir", dir)
	}
	for d := dir; !v.s.dirs[d]; d = filepath.Dir(d) {
		v.s.dirs[d] = true
	}
	return nil
}

func (v *simFS) SyncDir(dir string) error {
	dir = filepath.Clean(dir)
	cut, bits, err := v.lock("syncdir", dir)
	if err != nil {
		return err
	}
	s := v.s
	defer s.mu.Unlock()
	s.stats.Syncs++
	if cut && bits&1 == 0 {
		return s.powerFail("sync", dir) // the crash keeps a prefix of the journal anyway
	}
	if p, _ := s.decide("syncdir", dir); p < s.faults.SyncErr {
		s.stats.SyncErrs++
		return pathErr("sync", dir, syscall.EIO)
	}
	rest := s.pending[:0]
	for _, op := range s.pending {
		if op.dir == dir {
			op.apply(s.durable)
		} else {
			rest = append(rest, op)
		}
	}
	clear(s.pending[len(rest):])
	s.pending = rest
	if cut {
		return s.powerFail("sync", dir)
	}
	return nil
}

// simFile is an open file of a simFS.
type simFile struct {
	v           *simFS
	path        string
	ino         *inode
	off         int64
	app, rd, wr bool
	closed      bool
}

func (f *simFile) lock(op string) (cut bool, bits uint64, err error) {
	if cut, bits, err = f.v.lock(op, f.path); err != nil {
		return false, 0, err
	}
	if f.closed {
		f.v.s.mu.Unlock()
		return false, 0, pathErr(op, f.path, os.ErrClosed)
	}
	return cut, bits, nil
}

func (f *simFile) Read(b []byte) (int, error) {
	n, err := f.ReadAt(b, f.off)
	f.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (f *simFile) ReadAt(b []byte, off int64) (int, error) {
	cut, _, err := f.lock("read")
	if err != nil {
		return 0, err
	}
	defer f.v.s.mu.Unlock()
	if cut {
		return 0, f.v.s.powerFail("read", f.path)
	}
	if !f.rd {
		return 0, pathErr("read", f.path, syscall.EBADF)
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(b, f.ino.data[off:])
	f.v.s.misread(f.path, f.ino, b[:n], off)
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *simFile) Write(b []byte) (int, error) {
	if f.app {
		return f.writeAt(b, -1)
	}
	n, err := f.writeAt(b, f.off)
	f.off += int64(n)
	return n, err
}

func (f *simFile) WriteAt(b []byte, off int64) (int, error) { return f.writeAt(b, off) }

// writeAt writes b at off (-1: at the end), with the write faults. Power
// failing during it leaves a prefix of b in the page cache, whose pages
// the crash keeps or loses one by one.
func (f *simFile) writeAt(b []byte, off int64) (int, error) {
	cut, cbits, err := f.lock("write")
	if err != nil {
		return 0, err
	}
	s := f.v.s
	defer s.mu.Unlock()
	if !f.wr {
		return 0, pathErr("write", f.path, syscall.EBADF)
	}
	if off < 0 {
		off = int64(len(f.ino.data))
	}
	if cut {
		f.ino.write(b[:cbits%uint64(len(b)+1)], off, false)
		return 0, s.powerFail("write", f.path)
	}
	s.stats.Writes++
	n, err, lost := len(b), error(nil), false
	p, bits := s.decide("write", f.path)
	switch {
	case p < s.faults.NoSpace:
		s.stats.NoSpaces++
		n, err = int(bits%uint64(len(b)+1)), syscall.ENOSPC
	case p < s.faults.NoSpace+s.faults.WriteErr:
		s.stats.WriteErrs++
		n, err = int(bits%uint64(len(b)+1)), syscall.EIO
	case p < s.faults.NoSpace+s.faults.WriteErr+s.faults.LostWrite:
		s.stats.LostWrites++
		lost = true
	}
	f.ino.write(b[:n], off, lost)
	if err != nil {
		return n, pathErr("write", f.path, err)
	}
	return n, nil
}

func (f *simFile) Truncate(size int64) error {
	cut, bits, err := f.lock("truncate")
	if err != nil {
		return err
	}
	defer f.v.s.mu.Unlock()
	if !cut || bits&1 == 1 {
		f.ino.truncate(size)
	}
	if cut {
		return f.v.s.powerFail("truncate", f.path)
	}
	return nil
}

func (f *simFile) Sync() error { return f.sync("fsync") }

func (f *simFile) Datasync() error { return f.sync("fdatasync") }

// sync is fsync and fdatasync. Power failing during one leaves some of
// its pages on the platter (those an interrupted writeback got to) and
// loses the rest.
func (f *simFile) sync(op string) error {
	cut, cbits, err := f.lock(op)
	if err != nil {
		return err
	}
	s := f.v.s
	defer s.mu.Unlock()
	s.stats.Syncs++
	if cut {
		f.ino.sync(true, cbits)
		return s.powerFail(op, f.path)
	}
	p, bits := s.decide("sync", f.path)
	failed := p < s.faults.SyncErr
	f.ino.sync(failed, bits)
	if failed {
		s.stats.SyncErrs++
		return pathErr(op, f.path, syscall.EIO)
	}
	return nil
}

func (f *simFile) Size() (int64, error) {
	cut, _, err := f.lock("stat")
	if err != nil {
		return 0, err
	}
	defer f.v.s.mu.Unlock()
	if cut {
		return 0, f.v.s.powerFail("stat", f.path)
	}
	return int64(len(f.ino.data)), nil
}

func (f *simFile) Close() error {
	cut, _, err := f.lock("close")
	if err != nil {
		return err
	}
	defer f.v.s.mu.Unlock()
	f.closed = true
	if cut {
		return f.v.s.powerFail("close", f.path)
	}
	return nil
}
