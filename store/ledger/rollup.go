package ledger

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/platformgw/gateway/billing"
	"github.com/platformgw/gateway/store"
)

// rollupFile is the log of the hourly rollups: frames (length, CRC32C,
// payload) each holding the rollups that changed since the frame before, at
// their full values, and the last sequence number they cover. Loading
// replays the frames (a later value replaces an earlier one, a tombstone
// removes one); what was appended after the last frame is replayed from the
// raw rows at Open, so the rollups always equal the sum of the rows, crash
// or not. A frame is written when a segment is sealed, before a prune and
// at Close, and costs what changed since (rows come in time order, so only
// recent hours change), never the whole set: the lock appends wait on is
// held only while the changes are encoded. When the log has grown to a few
// times the size of its content, or a write failed, it is rewritten whole
// (a .tmp file and a rename).
const (
	rollupFile  = "rollups.log"
	rollupMagic = "PLGROL02"
)

type rollKey struct {
	service, endpoint, product string
	hour                       int64 // unix seconds, a multiple of 3600
}

type rollVal struct {
	calls, capped        int64
	units, overage, cost int64
}

type rollEntry struct {
	user  string
	key   rollKey
	val   rollVal
	dirty bool // changed since the last frame
}

// userRollups are one user's rollups, by key and in hour order, so that a
// period summary reads only the hours it asks for.
type userRollups struct {
	byKey map[rollKey]*rollEntry
	order []*rollEntry // by hour; rows come in time order, so almost always appended
}

// rollups are kept in memory by user. Each is about 200 bytes; see
// docs/operations.md for the arithmetic.
type rollups struct {
	byUser map[string]*userRollups
	n      int
	// What the next frame holds: entries changed, and entries dropped.
	dirty   []*rollEntry
	dropped []*rollEntry
}

func newRollups() *rollups { return &rollups{byUser: make(map[string]*userRollups)} }

func hourOf(t time.Time) int64 {
	s := t.Unix()
	h := s - s%3600
	if s%3600 < 0 {
		h -= 3600
	}
	return h
}

// entry returns the rollup of user and k, adding an empty one.
func (r *rollups) entry(user string, k rollKey) *rollEntry {
	u := r.byUser[user]
	if u == nil {
		u = &userRollups{byKey: make(map[rollKey]*rollEntry)}
		r.byUser[user] = u
	}
	if e := u.byKey[k]; e != nil {
		return e
	}
	e := &rollEntry{user: user, key: k}
	u.byKey[k] = e
	i := len(u.order)
	if i > 0 && u.order[i-1].key.hour > k.hour {
		i, _ = slices.BinarySearchFunc(u.order, k.hour+1, func(x *rollEntry, h int64) int { return cmp.Compare(x.key.hour, h) })
	}
	u.order = slices.Insert(u.order, i, e)
	r.n++
	return e
}

func (r *rollups) add(e *store.LedgerEntry) {
	re := r.entry(e.UserID, rollKey{service: e.ServiceID, endpoint: e.EndpointID, product: e.ProductID, hour: hourOf(e.Time)})
	r.touch(re)
	v := &re.val
	v.calls++
	v.units = satAdd(v.units, int64(e.Units))
	v.overage = satAdd(v.overage, int64(e.Overage))
	v.cost = satAdd(v.cost, int64(e.Cost))
	if e.UnitsClaimed != 0 {
		v.capped++
	}
}

// touch puts e in the next frame.
func (r *rollups) touch(e *rollEntry) {
	if !e.dirty {
		e.dirty = true
		r.dirty = append(r.dirty, e)
	}
}

// span is the part of u.order with from <= hour < to (0: open).
func (u *userRollups) span(from, to int64, hasFrom, hasTo bool) []*rollEntry {
	lo, hi := 0, len(u.order)
	search := func(h int64) int {
		i, _ := slices.BinarySearchFunc(u.order, h, func(x *rollEntry, h int64) int { return cmp.Compare(x.key.hour, h) })
		return i
	}
	if hasFrom {
		lo = search(from)
	}
	if hasTo {
		hi = max(lo, search(to))
	}
	return u.order[lo:hi]
}

// dropBefore forgets the rollups of hours before cutoff.
func (r *rollups) dropBefore(cutoff int64) int {
	dropped := 0
	for user, u := range r.byUser {
		old := u.span(0, cutoff, false, true)
		if len(old) == 0 {
			continue
		}
		for _, e := range old {
			delete(u.byKey, e.key)
			r.dropped = append(r.dropped, e)
		}
		dropped += len(old)
		u.order = slices.Clone(u.order[len(old):])
		if len(u.order) == 0 {
			delete(r.byUser, user)
		}
	}
	r.n -= dropped
	return dropped
}

// collect returns the rollups matching f, sorted.
func (r *rollups) collect(f store.RollupFilter) []store.Rollup {
	var out []store.Rollup
	from, to := int64(0), int64(0)
	if !f.From.IsZero() {
		from = hourOf(f.From)
		if from < f.From.Unix() {
			from += 3600 // the hour the bound falls in started before it
		}
	}
	if !f.To.IsZero() {
		to = f.To.Unix()
	}
	visit := func(user string, u *userRollups) {
		if u == nil {
			return
		}
		for _, e := range u.span(from, to, !f.From.IsZero(), !f.To.IsZero()) {
			k, v := e.key, &e.val
			if f.ServiceID != "" && k.service != f.ServiceID {
				continue
			}
			out = append(out, store.Rollup{UserID: user, ServiceID: k.service, EndpointID: k.endpoint,
				ProductID: k.product, Hour: time.Unix(k.hour, 0).UTC(), Calls: v.calls,
				Units: billing.Units(v.units), Overage: billing.Units(v.overage), Cost: billing.Units(v.cost),
				Capped: v.capped})
		}
	}
	if f.UserID != "" {
		visit(f.UserID, r.byUser[f.UserID])
	} else {
		for user, u := range r.byUser {
			visit(user, u)
		}
	}
	slices.SortFunc(out, func(a, b store.Rollup) int {
		return cmp.Or(a.Hour.Compare(b.Hour), cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.ServiceID, b.ServiceID),
			cmp.Compare(a.EndpointID, b.EndpointID), cmp.Compare(a.ProductID, b.ProductID))
	})
	return out
}

// frame encodes the rollups changed since the last frame (all of them
// with full), covering rows up to lastSeq, and forgets that they changed.
// On a failed write the caller calls redo with the returned entries.
func (r *rollups) frame(lastSeq uint64, full bool) (payload []byte, sent []*rollEntry, gone []*rollEntry) {
	changed := r.dirty
	if full {
		changed = make([]*rollEntry, 0, r.n)
		for _, u := range r.byUser {
			changed = append(changed, u.order...)
		}
	}
	d := newDict()
	id := func(s string) uint64 {
		if v, ok := d.ids[s]; ok {
			return v
		}
		d.add(s)
		return uint64(len(d.strs) - 1)
	}
	var body []byte
	put := func(e *rollEntry, tomb bool) {
		body = binary.AppendUvarint(body, id(e.user))
		body = binary.AppendUvarint(body, id(e.key.service))
		body = binary.AppendUvarint(body, id(e.key.endpoint))
		body = binary.AppendUvarint(body, id(e.key.product))
		body = binary.AppendVarint(body, e.key.hour)
		if tomb {
			body = append(body, 1)
			return
		}
		body = append(body, 0)
		body = binary.AppendVarint(body, e.val.calls)
		body = binary.AppendVarint(body, e.val.units)
		body = binary.AppendVarint(body, e.val.overage)
		body = binary.AppendVarint(body, e.val.cost)
		body = binary.AppendVarint(body, e.val.capped)
	}
	n := 0
	for _, e := range changed {
		if r.live(e) {
			put(e, false)
			n++
		}
		e.dirty = false
	}
	gone = r.dropped
	if !full {
		for _, e := range gone {
			put(e, true)
			n++
		}
	}
	r.dirty, r.dropped = nil, nil
	b := make([]byte, frameHeader, frameHeader+len(body)+64)
	b = binary.AppendUvarint(b, lastSeq)
	b = binary.AppendUvarint(b, uint64(len(d.strs)))
	for _, s := range d.strs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(n))
	b = append(b, body...)
	putFrame(b, b[frameHeader:])
	return b, changed, gone
}

// live says whether e is still one of the rollups (not dropped since).
func (r *rollups) live(e *rollEntry) bool {
	u := r.byUser[e.user]
	return u != nil && u.byKey[e.key] == e
}

// redo puts back into the next frame what a failed write did not save.
func (r *rollups) redo(sent, gone []*rollEntry) {
	for _, e := range sent {
		if r.live(e) {
			r.touch(e)
		}
	}
	r.dropped = append(r.dropped, gone...)
}

// loadRollups replays the rollup log. A missing log is empty rollups
// covering nothing; a frame cut short at the end (a crash while it was
// written) is dropped, and end says where the good frames end; anything
// else wrong is an error naming the file.
func loadRollups(path string) (ro *rollups, lastSeq uint64, end int64, err error) {
	ro = newRollups()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return ro, 0, 0, nil
	}
	if err != nil {
		return nil, 0, 0, err
	}
	if len(b) < len(rollupMagic) || string(b[:len(rollupMagic)]) != rollupMagic {
		return nil, 0, 0, fileError(path, errors.New("not a rollup log"))
	}
	off := int64(len(rollupMagic))
	for off < int64(len(b)) {
		rest := b[off:]
		if len(rest) < frameHeader {
			break // torn
		}
		n := int64(binary.LittleEndian.Uint32(rest[:4]))
		if n > int64(len(rest))-frameHeader {
			break // torn
		}
		payload := rest[frameHeader : frameHeader+n]
		if crc(payload) != binary.LittleEndian.Uint32(rest[4:8]) {
			if off+frameHeader+n < int64(len(b)) {
				return nil, 0, 0, fileError(path, fmt.Errorf("checksum mismatch at offset %d", off))
			}
			break // the last frame, torn
		}
		seq, err := ro.apply(payload)
		if err != nil {
			return nil, 0, 0, fileError(path, fmt.Errorf("malformed frame at offset %d", off))
		}
		lastSeq = seq
		off += frameHeader + n
	}
	ro.dirty, ro.dropped = nil, nil
	for _, u := range ro.byUser {
		for _, e := range u.order {
			e.dirty = false
		}
	}
	return ro, lastSeq, off, nil
}

// apply replays one frame.
func (ro *rollups) apply(payload []byte) (uint64, error) {
	r := colReader{rowMode: true}
	r.cols[0] = payload
	lastSeq := r.uvarint(0)
	nd := r.uvarint(0)
	strs := make([]string, 0, min(nd, 1<<16))
	for i := uint64(0); i < nd && r.err == nil; i++ {
		strs = append(strs, r.str(0))
	}
	n := r.uvarint(0)
	name := func() string {
		i := r.uvarint(0)
		if i >= uint64(len(strs)) {
			r.err = errCorrupt
			return ""
		}
		return strs[i]
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		user := name()
		k := rollKey{service: name(), endpoint: name(), product: name(), hour: r.varint(0)}
		tomb := r.bytes(0, 1)
		if r.err != nil {
			break
		}
		if tomb[0] == 1 {
			ro.remove(user, k)
			continue
		}
		v := rollVal{calls: r.varint(0), units: r.varint(0), overage: r.varint(0), cost: r.varint(0), capped: r.varint(0)}
		if r.err == nil {
			ro.entry(user, k).val = v
		}
	}
	if r.err != nil || len(r.cols[0]) != 0 {
		return 0, errCorrupt
	}
	return lastSeq, nil
}

// remove forgets one rollup (a tombstone in the log).
func (r *rollups) remove(user string, k rollKey) {
	u := r.byUser[user]
	if u == nil || u.byKey[k] == nil {
		return
	}
	e := u.byKey[k]
	delete(u.byKey, k)
	if i := slices.Index(u.order, e); i >= 0 {
		u.order = slices.Delete(u.order, i, i+1)
	}
	if len(u.order) == 0 {
		delete(r.byUser, user)
	}
	r.n--
}
