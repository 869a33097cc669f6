package ledger

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/framed"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// A ledger directory holds segments named by the first sequence number
// they may hold, so that name order is append order:
//
//	seg-00000000000000000001.raw   the active segment (or one waiting to be sealed)
//	seg-00000000000000000001.zst   a sealed segment
//	rollups.log                    the hourly rollups and what they cover (rollup.go)
//	*.tmp                          a write that did not finish (removed at Open)
//
// A raw segment is a header and blocks in internal/store/framed's frames
// (length, CRC-32C), one per Append. A sealed segment is zstd-compressed chunks of columns and
// a checksummed footer (dictionary, chunk index, time range). Sealed files
// are written under a .tmp name, synced and renamed, so a reader sees a
// whole sealed segment or none.
const (
	rawExt    = ".raw"
	sealedExt = ".zst"
	tmpExt    = ".tmp"

	rawMagic    = "PLGRAW01"
	sealedMagic = "PLGSEG01"
	sealedEnd   = "PLGEND01"

	rawHeaderLen = 28 // magic, start position, created, crc
	maxBlock     = 256 << 20
)

// blockFormat is what framed reads a raw segment's blocks as.
var blockFormat = framed.Format{Noun: "block", Max: maxBlock}

// crc is the checksum of every block, chunk, header and footer: framed's.
func crc(b []byte) uint32 { return framed.Checksum(b) }

func segName(base uint64, ext string) string {
	return fmt.Sprintf("seg-%020d%s", base, ext)
}

// parseSegName reads a segment file name; ok is false for other files.
func parseSegName(name string) (base uint64, ext string, ok bool) {
	rest, found := strings.CutPrefix(name, "seg-")
	if !found {
		return 0, "", false
	}
	num, ext, found := strings.Cut(rest, ".")
	if !found || ("."+ext != rawExt && "."+ext != sealedExt) {
		return 0, "", false
	}
	base, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return base, "." + ext, true
}

// segMeta is what the ledger keeps in memory of a segment.
type segMeta struct {
	base     uint64
	path     string
	sealed   bool
	startPos uint64 // the position before the segment's first block
	pos      uint64 // the position its last block covers
	created  int64
	rows     int64
	firstSeq uint64
	lastSeq  uint64
	minTime  int64 // of the rows' times, unix nanoseconds
	maxTime  int64
	size     int64 // bytes on disk (a raw segment: bytes committed)
	// sealed only
	dict   *dict
	chunks []chunkMeta
}

type chunkMeta struct {
	off, length int64
	sum         uint32
	rows        int64
	firstSeq    uint64
	minTime     int64
	maxTime     int64
}

// note records a row's sequence number and time in m.
func (m *segMeta) note(e *store.LedgerEntry) {
	t := int64(math.MinInt64)
	if !e.Time.IsZero() {
		t = e.Time.UnixNano()
	}
	if m.rows == 0 {
		m.firstSeq, m.minTime, m.maxTime = e.Seq, t, t
	}
	m.rows++
	m.lastSeq = e.Seq
	m.minTime, m.maxTime = min(m.minTime, t), max(m.maxTime, t)
}

// overlaps says whether rows in [from, to) may be in m (zero bounds open).
func overlaps(minT, maxT int64, from, to int64) bool {
	return (from == 0 || maxT >= from) && (to == 0 || minT < to)
}

func encodeRawHeader(startPos uint64, created int64) []byte {
	b := make([]byte, 0, rawHeaderLen)
	b = append(b, rawMagic...)
	b = binary.LittleEndian.AppendUint64(b, startPos)
	b = binary.LittleEndian.AppendUint64(b, uint64(created))
	return binary.LittleEndian.AppendUint32(b, crc(b))
}

// rawState is a raw segment as read back: what the appender needs to go on.
type rawState struct {
	meta   segMeta
	dict   *dict
	row    rowState
	end    int64         // offset after the last good block
	tail   *framed.Error // a torn tail after end (tornOK), for the caller to cut
	broken bool          // not even a whole header: written by a crash at creation
	// fault says what is wrong with a torn or broken segment's tail and
	// where, for the error when the tail turns out to be damage (Open).
	fault string
}

// readRaw reads a raw segment's blocks, calling fn (if not nil) for each
// entry, up to limit bytes (limit < 0: the whole file). With tornOK a torn
// tail (framed's rule: a block cut short by a crash) ends the segment and
// is reported in tail; anything else wrong is an error naming the file.
func readRaw(fsys vfs.FS, path string, base uint64, limit int64, tornOK bool, fn func(*store.LedgerEntry) error) (*rawState, error) {
	f, err := vfs.Open(fsys, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size := limit
	if size < 0 {
		if size, err = f.Size(); err != nil {
			return nil, err
		}
	}
	st := &rawState{dict: newDict()}
	st.meta.base, st.meta.path = base, path
	hdr := make([]byte, rawHeaderLen)
	if _, err := io.ReadFull(f, hdr); err != nil || crc(hdr[:rawHeaderLen-4]) != binary.LittleEndian.Uint32(hdr[rawHeaderLen-4:]) ||
		string(hdr[:8]) != rawMagic {
		if size < rawHeaderLen {
			st.fault = fmt.Sprintf("truncated segment header at offset 0: the file has %d bytes of the header's %d", size, rawHeaderLen)
			if tornOK {
				st.broken = true
				return st, nil
			}
			return nil, fileError(path, errors.New(st.fault))
		}
		if tornOK && allZero(f, size) {
			// Its size reached the disk and its header did not: a crash
			// between the segment's creation and its header's sync
			// (found by the storage simulation, power failing during a
			// prune's seal). Rows are appended only after that sync, so
			// it held none.
			st.fault = fmt.Sprintf("a segment header of zeros: the file's %d bytes are all zero", size)
			st.broken = true
			return st, nil
		}
		return nil, fileError(path, errors.New("bad segment header at offset 0"))
	}
	st.meta.startPos = binary.LittleEndian.Uint64(hdr[8:])
	st.meta.pos = st.meta.startPos
	st.meta.created = int64(binary.LittleEndian.Uint64(hdr[16:]))
	blocks := framed.New(path, bufio.NewReaderSize(f, 1<<20), rawHeaderLen, size, blockFormat)
	var e store.LedgerEntry
	r := colReader{rowMode: true}
	for {
		payload, ok := blocks.Next()
		if !ok {
			break
		}
		off := blocks.Offset()
		// A block that passed its checksum but does not decode is damage
		// (or a bug), never a torn write.
		r.cols[0] = payload
		upto := r.uvarint(0)
		nNew := r.uvarint(0)
		if nNew > maxBlock {
			return nil, fileError(path, fmt.Errorf("malformed block at offset %d", off))
		}
		for range nNew {
			st.dict.add(r.str(0))
		}
		nRows := r.uvarint(0)
		if r.err != nil || nRows > maxBlock {
			return nil, fileError(path, fmt.Errorf("malformed block at offset %d", off))
		}
		for range nRows {
			if err := decodeEntry(&r, &st.row, st.dict.strs, &e); err != nil {
				return nil, fileError(path, fmt.Errorf("malformed entry in block at offset %d", off))
			}
			st.meta.note(&e)
			if fn != nil {
				if err := fn(&e); err != nil {
					return nil, err
				}
			}
		}
		if len(r.cols[0]) != 0 {
			return nil, fileError(path, fmt.Errorf("trailing bytes in block at offset %d", off))
		}
		st.meta.pos = upto
	}
	st.end = blocks.End()
	if err := blocks.Err(); err != nil {
		var bad *framed.Error
		if !errors.As(err, &bad) {
			return nil, err
		}
		if !tornOK || !bad.Torn {
			return nil, fileError(path, errors.New(bad.What()))
		}
		st.tail, st.fault = bad, bad.What()
		return st, nil
	}
	st.meta.size = st.end
	return st, nil
}

// sealedWriter writes a sealed segment.
type sealedWriter struct {
	f    vfs.File
	bw   *bufio.Writer
	off  int64
	enc  *zstd.Encoder
	meta segMeta
	cw   colWriter
	row  rowState
	buf  []byte
	rows []store.LedgerEntry
	dict *dict
	max  int

	chunkList []chunkMeta
}

// sealRaw writes the raw segment src as a sealed segment at dst (a .tmp
// name the caller renames), synced. It streams: at most one chunk of rows
// is in memory.
func sealRaw(fsys vfs.FS, src *segMeta, dst string, chunkRows int, level zstd.EncoderLevel) (segMeta, error) {
	f, err := fsys.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return segMeta{}, err
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(true))
	if err != nil {
		f.Close()
		return segMeta{}, err
	}
	defer enc.Close()
	w := &sealedWriter{f: f, bw: bufio.NewWriterSize(f, 1<<20), enc: enc, max: chunkRows, dict: newDict()}
	w.bw.WriteString(sealedMagic)
	w.off = int64(len(sealedMagic))
	st, err := readRaw(fsys, src.path, src.base, src.size, false, func(e *store.LedgerEntry) error {
		w.rows = append(w.rows, *e)
		if len(w.rows) == w.max {
			return w.flushChunk()
		}
		return nil
	})
	if err == nil {
		err = w.flushChunk()
	}
	if err == nil {
		w.meta = st.meta
		w.meta.sealed = true
		w.meta.chunks = w.chunkList
		err = w.writeFooter()
	}
	if err == nil {
		err = w.bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fsys.Remove(dst)
		return segMeta{}, err
	}
	w.meta.size = w.off
	w.meta.dict = w.dict
	return w.meta, nil
}

// flushChunk encodes the pending rows as one compressed chunk. The
// segment's dictionary grows as chunks are written (ids never change) and
// goes into the footer at the end.
func (w *sealedWriter) flushChunk() error {
	if len(w.rows) == 0 {
		return nil
	}
	w.cw.reset()
	w.row = rowState{}
	cm := chunkMeta{off: w.off, rows: int64(len(w.rows)), firstSeq: w.rows[0].Seq, minTime: math.MaxInt64, maxTime: math.MinInt64}
	for i := range w.rows {
		e := &w.rows[i]
		var ids [5]uint64
		for j, s := range [5]string{e.UserID, e.ServiceID, e.EndpointID, e.ProductID, e.Source} {
			id, ok := w.dict.ids[s]
			if !ok {
				w.dict.add(s)
				id = uint64(len(w.dict.strs) - 1)
			}
			ids[j] = id
		}
		if err := encodeEntry(&w.cw, &w.row, e, ids); err != nil {
			return err
		}
		t := int64(math.MinInt64)
		if !e.Time.IsZero() {
			t = e.Time.UnixNano()
		}
		cm.minTime, cm.maxTime = min(cm.minTime, t), max(cm.maxTime, t)
	}
	w.buf = w.buf[:0]
	w.buf = binary.AppendUvarint(w.buf, numCols)
	for _, c := range w.cw.cols {
		w.buf = binary.AppendUvarint(w.buf, uint64(len(c)))
	}
	for _, c := range w.cw.cols {
		w.buf = append(w.buf, c...)
	}
	out := w.enc.EncodeAll(w.buf, nil)
	cm.length = int64(len(out))
	cm.sum = crc(out)
	if _, err := w.bw.Write(out); err != nil {
		return err
	}
	w.off += cm.length
	w.chunkList = append(w.chunkList, cm)
	w.rows = w.rows[:0]
	return nil
}

func (w *sealedWriter) writeFooter() error {
	b := encodeFooter(&w.meta, w.dict)
	var t [8]byte
	binary.LittleEndian.PutUint32(t[:4], uint32(len(b)))
	binary.LittleEndian.PutUint32(t[4:], crc(b))
	w.bw.Write(b)
	w.bw.Write(t[:])
	_, err := w.bw.WriteString(sealedEnd)
	w.off += int64(len(b)) + 8 + int64(len(sealedEnd))
	return err
}

func encodeFooter(m *segMeta, d *dict) []byte {
	var b []byte
	b = binary.AppendUvarint(b, 1) // version
	b = binary.AppendUvarint(b, m.startPos)
	b = binary.AppendUvarint(b, m.pos)
	b = binary.AppendVarint(b, m.created)
	b = binary.AppendUvarint(b, uint64(m.rows))
	b = binary.AppendUvarint(b, m.firstSeq)
	b = binary.AppendUvarint(b, m.lastSeq)
	b = binary.AppendVarint(b, m.minTime)
	b = binary.AppendVarint(b, m.maxTime)
	b = binary.AppendUvarint(b, uint64(len(d.strs)))
	for _, s := range d.strs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(len(m.chunks)))
	for _, c := range m.chunks {
		b = binary.AppendUvarint(b, uint64(c.off))
		b = binary.AppendUvarint(b, uint64(c.length))
		b = binary.AppendUvarint(b, uint64(c.sum))
		b = binary.AppendUvarint(b, uint64(c.rows))
		b = binary.AppendUvarint(b, c.firstSeq)
		b = binary.AppendVarint(b, c.minTime)
		b = binary.AppendVarint(b, c.maxTime)
	}
	return b
}

// readSealedMeta reads and checks a sealed segment's footer.
func readSealedMeta(fsys vfs.FS, path string, base uint64) (segMeta, error) {
	f, err := vfs.Open(fsys, path)
	if err != nil {
		return segMeta{}, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return segMeta{}, err
	}
	var tail [16]byte
	if size < int64(len(sealedMagic)+len(tail)) {
		return segMeta{}, fileError(path, errors.New("file too short"))
	}
	if _, err := f.ReadAt(tail[:], size-16); err != nil {
		return segMeta{}, err
	}
	n := int64(binary.LittleEndian.Uint32(tail[:4]))
	if string(tail[8:]) != sealedEnd || n > size-24 {
		return segMeta{}, fileError(path, errors.New("bad footer"))
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, size-16-n); err != nil {
		return segMeta{}, err
	}
	if crc(b) != binary.LittleEndian.Uint32(tail[4:]) {
		return segMeta{}, fileError(path, errors.New("footer checksum mismatch"))
	}
	r := colReader{rowMode: true}
	r.cols[0] = b
	m := segMeta{base: base, path: path, sealed: true, size: size, dict: newDict()}
	if v := r.uvarint(0); v != 1 {
		return segMeta{}, fileError(path, fmt.Errorf("unknown segment version %d", v))
	}
	m.startPos = r.uvarint(0)
	m.pos = r.uvarint(0)
	m.created = r.varint(0)
	m.rows = int64(r.uvarint(0))
	m.firstSeq = r.uvarint(0)
	m.lastSeq = r.uvarint(0)
	m.minTime = r.varint(0)
	m.maxTime = r.varint(0)
	nd := r.uvarint(0)
	for i := uint64(0); i < nd && r.err == nil; i++ {
		m.dict.add(r.str(0))
	}
	nc := r.uvarint(0)
	for i := uint64(0); i < nc && r.err == nil; i++ {
		c := chunkMeta{off: int64(r.uvarint(0)), length: int64(r.uvarint(0)), sum: uint32(r.uvarint(0)),
			rows: int64(r.uvarint(0)), firstSeq: r.uvarint(0), minTime: r.varint(0), maxTime: r.varint(0)}
		if c.off < 0 || c.length < 0 || c.off+c.length > size {
			r.err = errCorrupt
		}
		m.chunks = append(m.chunks, c)
	}
	if r.err != nil {
		return segMeta{}, fileError(path, errors.New("malformed footer"))
	}
	return m, nil
}

// chunkReader reads the chunks of sealed segments.
type chunkReader struct {
	dec  *zstd.Decoder
	comp []byte
	raw  []byte
}

func newChunkReader() (*chunkReader, error) {
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxBlock))
	if err != nil {
		return nil, err
	}
	return &chunkReader{dec: dec}, nil
}

func (c *chunkReader) close() { c.dec.Close() }

// read decodes chunk i of m, calling fn for each row.
func (c *chunkReader) read(f vfs.File, m *segMeta, i int, fn func(*store.LedgerEntry) error) error {
	cm := m.chunks[i]
	if int64(cap(c.comp)) < cm.length {
		c.comp = make([]byte, cm.length)
	}
	c.comp = c.comp[:cm.length]
	if _, err := f.ReadAt(c.comp, cm.off); err != nil {
		return fileError(m.path, fmt.Errorf("chunk %d: %v", i, err))
	}
	if crc(c.comp) != cm.sum {
		return fileError(m.path, fmt.Errorf("chunk %d: checksum mismatch", i))
	}
	var err error
	if c.raw, err = c.dec.DecodeAll(c.comp, c.raw[:0]); err != nil {
		return fileError(m.path, fmt.Errorf("chunk %d: %v", i, err))
	}
	r := colReader{}
	rest := c.raw
	nc, n := binary.Uvarint(rest)
	if n <= 0 || nc != numCols {
		return fileError(m.path, fmt.Errorf("chunk %d: bad column count", i))
	}
	rest = rest[n:]
	var lens [numCols]uint64
	for j := range lens {
		if lens[j], n = binary.Uvarint(rest); n <= 0 {
			return fileError(m.path, fmt.Errorf("chunk %d: bad column table", i))
		}
		rest = rest[n:]
	}
	for j, l := range lens {
		if l > uint64(len(rest)) {
			return fileError(m.path, fmt.Errorf("chunk %d: bad column table", i))
		}
		r.cols[j], rest = rest[:l], rest[l:]
	}
	var st rowState
	var e store.LedgerEntry
	for range cm.rows {
		if err := decodeEntry(&r, &st, m.dict.strs, &e); err != nil {
			return fileError(m.path, fmt.Errorf("chunk %d: malformed row", i))
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
	return nil
}

// allZero reports whether the first size bytes of f are all zero.
func allZero(f vfs.File, size int64) bool {
	buf := make([]byte, 64<<10)
	for off := int64(0); off < size; {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
		for _, b := range buf[:n] {
			if b != 0 {
				return false
			}
		}
		off += int64(n)
		if err != nil {
			return err == io.EOF && off >= size
		}
	}
	return true
}
