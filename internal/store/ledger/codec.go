package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
)

// An entry is written field by field, each field to a column. The active
// segment writes every column to the same buffer (row by row, so a block
// can be appended and read back alone); a sealed chunk gives each column a
// buffer of its own and stores them one after the other, so that zstd sees
// long runs of alike bytes (time deltas, dictionary ids, zero overages)
// and squeezes them to almost nothing. Both use the same code below.
const (
	colFlags = iota
	colSeq
	colTime
	colUser
	colService
	colEndpoint
	colProduct
	colSource
	colUnits
	colOverage
	colCost
	colClaimed
	colID
	colRequestUUID
	colRequestText
	colOccurred
	colIdem
	numCols
)

// Entry flags: which optional fields a row carries and how.
const (
	flagCustomID    = 1 << iota // ID is not "led_<seq>": stored as text
	flagRequestUUID             // RequestID is a canonical lowercase UUID: 16 bytes
	flagRequestText             // RequestID is other text
	flagOccurred                // OccurredAt is set
	flagIdem                    // IdempotencyKey is set
	flagOverage                 // Overage is not zero
	flagCost                    // Cost is not zero
	flagClaimed                 // UnitsClaimed is not zero
	flagZeroTime                // Time is the zero time
)

// maxString bounds one stored string; a longer length is damage.
const maxString = 1 << 20

// dict interns the ids of a segment (user, service, endpoint, product,
// source) as small integers. Each segment has its own, so a segment read
// alone (or kept alone after retention) needs nothing else.
type dict struct {
	ids  map[string]uint64
	strs []string
}

func newDict() *dict { return &dict{ids: make(map[string]uint64)} }

// lookup returns s's id, adding s to pending (ids after the committed
// ones) when it is new. pending is committed by commit.
func (d *dict) lookup(s string, pending *[]string) uint64 {
	if id, ok := d.ids[s]; ok {
		return id
	}
	for i, p := range *pending {
		if p == s {
			return uint64(len(d.strs) + i)
		}
	}
	*pending = append(*pending, s)
	return uint64(len(d.strs) + len(*pending) - 1)
}

func (d *dict) add(s string) {
	d.ids[s] = uint64(len(d.strs))
	d.strs = append(d.strs, s)
}

func (d *dict) has(s string) bool {
	_, ok := d.ids[s]
	return ok
}

// rowState carries the deltas from one row to the next.
type rowState struct {
	seq  uint64
	time int64
}

// colWriter appends fields to columns; with rowMode every column is the
// same buffer.
type colWriter struct {
	rowMode bool
	cols    [numCols][]byte
}

func (w *colWriter) col(c int) *[]byte {
	if w.rowMode {
		return &w.cols[0]
	}
	return &w.cols[c]
}

func (w *colWriter) uvarint(c int, v uint64) {
	p := w.col(c)
	*p = binary.AppendUvarint(*p, v)
}

func (w *colWriter) varint(c int, v int64) {
	p := w.col(c)
	*p = binary.AppendVarint(*p, v)
}

func (w *colWriter) str(c int, s string) {
	p := w.col(c)
	*p = binary.AppendUvarint(*p, uint64(len(s)))
	*p = append(*p, s...)
}

func (w *colWriter) raw(c int, b []byte) {
	p := w.col(c)
	*p = append(*p, b...)
}

// reset empties the columns, keeping their memory.
func (w *colWriter) reset() {
	for i := range w.cols {
		w.cols[i] = w.cols[i][:0]
	}
}

// errTimeRange refuses a time that int64 nanoseconds cannot hold (before
// 1678 or after 2262); the gateway's clock never produces one.
var errTimeRange = errors.New("ledger: entry time out of range (years 1678 to 2262)")

func unixNano(t time.Time) (int64, error) {
	if t.Year() < 1678 || t.Year() > 2261 {
		return 0, errTimeRange
	}
	return t.UnixNano(), nil
}

// encodeEntry writes e. ids are its dictionary ids (user, service,
// endpoint, product, source).
func encodeEntry(w *colWriter, st *rowState, e *store.LedgerEntry, ids [5]uint64) error {
	var flags uint64
	if e.ID != defaultID(e.Seq) {
		flags |= flagCustomID
	}
	var uuid [16]byte
	if e.RequestID != "" {
		if parseUUID(e.RequestID, &uuid) {
			flags |= flagRequestUUID
		} else {
			flags |= flagRequestText
		}
	}
	if !e.OccurredAt.IsZero() {
		flags |= flagOccurred
	}
	if e.IdempotencyKey != "" {
		flags |= flagIdem
	}
	if e.Overage != 0 {
		flags |= flagOverage
	}
	if e.Cost != 0 {
		flags |= flagCost
	}
	if e.UnitsClaimed != 0 {
		flags |= flagClaimed
	}
	var t int64
	if e.Time.IsZero() {
		flags |= flagZeroTime
	} else {
		var err error
		if t, err = unixNano(e.Time); err != nil {
			return err
		}
	}
	w.uvarint(colFlags, flags)
	w.varint(colSeq, int64(e.Seq-st.seq))
	st.seq = e.Seq
	if flags&flagZeroTime == 0 {
		w.varint(colTime, t-st.time)
		st.time = t
	}
	w.uvarint(colUser, ids[0])
	w.uvarint(colService, ids[1])
	w.uvarint(colEndpoint, ids[2])
	w.uvarint(colProduct, ids[3])
	w.uvarint(colSource, ids[4])
	w.varint(colUnits, int64(e.Units))
	if flags&flagOverage != 0 {
		w.varint(colOverage, int64(e.Overage))
	}
	if flags&flagCost != 0 {
		w.varint(colCost, int64(e.Cost))
	}
	if flags&flagClaimed != 0 {
		w.varint(colClaimed, int64(e.UnitsClaimed))
	}
	if flags&flagCustomID != 0 {
		w.str(colID, e.ID)
	}
	if flags&flagRequestUUID != 0 {
		w.raw(colRequestUUID, uuid[:])
	}
	if flags&flagRequestText != 0 {
		w.str(colRequestText, e.RequestID)
	}
	if flags&flagOccurred != 0 {
		// Seconds apart from Time, then nanoseconds: a reporter's
		// timestamp may lie outside what int64 nanoseconds hold.
		w.varint(colOccurred, e.OccurredAt.Unix()-e.Time.Unix())
		w.uvarint(colOccurred, uint64(e.OccurredAt.Nanosecond()))
	}
	if flags&flagIdem != 0 {
		w.str(colIdem, e.IdempotencyKey)
	}
	return nil
}

// colReader reads fields back from columns; the first error sticks.
type colReader struct {
	rowMode bool
	cols    [numCols][]byte
	err     error
}

var errCorrupt = errors.New("malformed data")

func (r *colReader) col(c int) *[]byte {
	if r.rowMode {
		return &r.cols[0]
	}
	return &r.cols[c]
}

func (r *colReader) uvarint(c int) uint64 {
	p := r.col(c)
	v, n := binary.Uvarint(*p)
	if n <= 0 {
		r.err = errCorrupt
		*p = nil
		return 0
	}
	*p = (*p)[n:]
	return v
}

func (r *colReader) varint(c int) int64 {
	p := r.col(c)
	v, n := binary.Varint(*p)
	if n <= 0 {
		r.err = errCorrupt
		*p = nil
		return 0
	}
	*p = (*p)[n:]
	return v
}

func (r *colReader) bytes(c int, n uint64) []byte {
	p := r.col(c)
	if n > uint64(len(*p)) {
		r.err = errCorrupt
		*p = nil
		return nil
	}
	b := (*p)[:n]
	*p = (*p)[n:]
	return b
}

func (r *colReader) str(c int) string {
	n := r.uvarint(c)
	if n > maxString {
		r.err = errCorrupt
		return ""
	}
	return string(r.bytes(c, n))
}

// decodeEntry reads the next entry into e, ids resolved through strs.
func decodeEntry(r *colReader, st *rowState, strs []string, e *store.LedgerEntry) error {
	flags := r.uvarint(colFlags)
	e.Seq = st.seq + uint64(r.varint(colSeq))
	st.seq = e.Seq
	if flags&flagZeroTime != 0 {
		e.Time = time.Time{}
	} else {
		st.time += r.varint(colTime)
		e.Time = time.Unix(0, st.time).UTC()
	}
	name := func(c int) string {
		id := r.uvarint(c)
		if id >= uint64(len(strs)) {
			r.err = errCorrupt
			return ""
		}
		return strs[id]
	}
	e.UserID = name(colUser)
	e.ServiceID = name(colService)
	e.EndpointID = name(colEndpoint)
	e.ProductID = name(colProduct)
	e.Source = name(colSource)
	e.Units = billing.Units(r.varint(colUnits))
	e.Overage, e.Cost, e.UnitsClaimed = 0, 0, 0
	if flags&flagOverage != 0 {
		e.Overage = billing.Units(r.varint(colOverage))
	}
	if flags&flagCost != 0 {
		e.Cost = billing.Units(r.varint(colCost))
	}
	if flags&flagClaimed != 0 {
		e.UnitsClaimed = billing.Units(r.varint(colClaimed))
	}
	if flags&flagCustomID != 0 {
		e.ID = r.str(colID)
	} else {
		e.ID = defaultID(e.Seq)
	}
	e.RequestID = ""
	if flags&flagRequestUUID != 0 {
		if b := r.bytes(colRequestUUID, 16); b != nil {
			e.RequestID = formatUUID(b)
		}
	}
	if flags&flagRequestText != 0 {
		e.RequestID = r.str(colRequestText)
	}
	e.OccurredAt = time.Time{}
	if flags&flagOccurred != 0 {
		sec := r.varint(colOccurred)
		nsec := r.uvarint(colOccurred)
		if nsec >= 1e9 {
			r.err = errCorrupt
		}
		e.OccurredAt = time.Unix(e.Time.Unix()+sec, int64(nsec)).UTC()
	}
	e.IdempotencyKey = ""
	if flags&flagIdem != 0 {
		e.IdempotencyKey = r.str(colIdem)
	}
	return r.err
}

// defaultID is the id the bbolt store gives every entry; it is not stored.
func defaultID(seq uint64) string {
	var b [24]byte
	return string(strconv.AppendUint(append(b[:0], "led_"...), seq, 10))
}

// parseUUID reads a canonical lowercase UUID (8-4-4-4-12 hex digits), the
// form Caddy's request ids take. Anything else (upper case, braces) is
// kept as text, so the id reads back byte for byte.
func parseUUID(s string, out *[16]byte) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	j := 0
	for i := 0; i < 36; {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			i++
			continue
		}
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return false
		}
		out[j] = hi<<4 | lo
		j++
		i += 2
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func formatUUID(b []byte) string {
	const hex = "0123456789abcdef"
	var s [36]byte
	j := 0
	for i := 0; i < 16; i++ {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			s[j] = '-'
			j++
		}
		s[j], s[j+1] = hex[b[i]>>4], hex[b[i]&0xf]
		j += 2
	}
	return string(s[:])
}

// fileError names the file a problem was found in and what to do.
func fileError(path string, err error) error {
	return fmt.Errorf("ledger file %s is damaged (%w): restore it from a backup, or move it out of the ledger directory to open the rest", path, err)
}
