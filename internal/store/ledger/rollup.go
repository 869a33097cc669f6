package ledger

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/platformgw/gateway/internal/billing"
	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/framed"
	"github.com/platformgw/gateway/internal/store/vfs"
)

// rollupFile is the log of the hourly rollups: after its magic, frames
// (internal/store/framed: length, CRC-32C, payload) each holding the rollups that changed since the frame before, at
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

// rollupFormat is what framed reads the rollup log's frames as. A frame
// holds every rollup when the log is rewritten: no limit but the frame's.
var rollupFormat = framed.Format{Noun: "frame"}

// rollKey is one rollup of a user: ids interned in the rollups' names,
// so that neither the key nor the entry holds a pointer (the garbage
// collector skips them, and hashing one is hashing 20 bytes).
type rollKey struct {
	service, endpoint, product uint32
	hour                       int64 // unix seconds, a multiple of 3600
}

type rollVal struct {
	calls, capped        int64
	units, overage, cost int64
}

type rollEntry struct {
	slot  rollKey
	val   rollVal
	dirty bool // changed since the last frame
}

// userRollups are one user's rollups in hour order, so that a period
// summary reads only the hours it asks for, with an index by key.
type userRollups struct {
	order   []rollEntry       // by hour; rows come in time order, so almost always appended
	index   map[rollKey]int32 // into order
	dirtyLo int               // no entry before order[dirtyLo] is dirty
	dirty   bool
}

// rollupRef names a rollup in a frame that was sent or dropped.
type rollupRef struct {
	user uint32
	slot rollKey
}

// rollups are kept in memory by user, about 100 bytes each; see
// docs/operations.md for the arithmetic.
type rollups struct {
	ids    map[string]uint32 // interned users, services, endpoints, products
	names  []string
	byUser map[uint32]*userRollups
	n      int
	// What the next frame holds besides the dirty entries: dropped ones.
	dropped []rollupRef
}

func newRollups() *rollups {
	return &rollups{ids: make(map[string]uint32), byUser: make(map[uint32]*userRollups)}
}

func (r *rollups) intern(s string) uint32 {
	if id, ok := r.ids[s]; ok {
		return id
	}
	id := uint32(len(r.names))
	r.ids[s] = id
	r.names = append(r.names, s)
	return id
}

func hourOf(t time.Time) int64 {
	s := t.Unix()
	h := s - s%3600
	if s%3600 < 0 {
		h -= 3600
	}
	return h
}

// entry returns the rollup of user and k, adding an empty one.
func (r *rollups) entry(user uint32, k rollKey) (*userRollups, int) {
	u := r.byUser[user]
	if u == nil {
		u = &userRollups{index: make(map[rollKey]int32)}
		r.byUser[user] = u
	}
	if i, ok := u.index[k]; ok {
		return u, int(i)
	}
	i := len(u.order)
	if i > 0 && u.order[i-1].slot.hour > k.hour {
		i, _ = slices.BinarySearchFunc(u.order, k.hour+1, func(x rollEntry, h int64) int { return cmp.Compare(x.slot.hour, h) })
		u.order = slices.Insert(u.order, i, rollEntry{slot: k})
		for j := i; j < len(u.order); j++ {
			u.index[u.order[j].slot] = int32(j)
		}
		if u.dirty && u.dirtyLo > i {
			u.dirtyLo = i
		}
	} else {
		u.order = append(u.order, rollEntry{slot: k})
		u.index[k] = int32(i)
	}
	r.n++
	return u, i
}

// touch marks order[i] of u changed, for the next frame.
func (u *userRollups) touch(i int) {
	u.order[i].dirty = true
	if !u.dirty || i < u.dirtyLo {
		u.dirtyLo = i
	}
	u.dirty = true
}

func (r *rollups) add(e *store.LedgerEntry) {
	k := rollKey{service: r.intern(e.ServiceID), endpoint: r.intern(e.EndpointID), product: r.intern(e.ProductID),
		hour: hourOf(e.Time)}
	u, i := r.entry(r.intern(e.UserID), k)
	u.touch(i)
	v := &u.order[i].val
	v.calls++
	v.units = int64(billing.SatAdd(billing.Units(v.units), e.Units))
	v.overage = int64(billing.SatAdd(billing.Units(v.overage), e.Overage))
	v.cost = int64(billing.SatAdd(billing.Units(v.cost), e.Cost))
	if e.UnitsClaimed != 0 {
		v.capped++
	}
}

// changed says whether there is anything for a frame.
func (r *rollups) changed() bool {
	if len(r.dropped) > 0 {
		return true
	}
	for _, u := range r.byUser {
		if u.dirty {
			return true
		}
	}
	return false
}

// span is the part of u.order with from <= hour < to (open without hasFrom,
// hasTo).
func (u *userRollups) span(from, to int64, hasFrom, hasTo bool) (lo, hi int) {
	lo, hi = 0, len(u.order)
	search := func(h int64) int {
		i, _ := slices.BinarySearchFunc(u.order, h, func(x rollEntry, h int64) int { return cmp.Compare(x.slot.hour, h) })
		return i
	}
	if hasFrom {
		lo = search(from)
	}
	if hasTo {
		hi = max(lo, search(to))
	}
	return lo, hi
}

// reindex rebuilds u's index after its order changed.
func (u *userRollups) reindex() {
	clear(u.index)
	for i, e := range u.order {
		u.index[e.slot] = int32(i)
	}
}

// dropBefore forgets the rollups of hours before cutoff.
func (r *rollups) dropBefore(cutoff int64) int {
	dropped := 0
	for user, u := range r.byUser {
		_, hi := u.span(0, cutoff, false, true)
		if hi == 0 {
			continue
		}
		for _, e := range u.order[:hi] {
			r.dropped = append(r.dropped, rollupRef{user, e.slot})
		}
		dropped += hi
		u.order = slices.Clone(u.order[hi:])
		u.dirtyLo = max(0, u.dirtyLo-hi)
		u.reindex()
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
	service, hasService := uint32(0), f.ServiceID != ""
	if hasService {
		var ok bool
		if service, ok = r.ids[f.ServiceID]; !ok {
			return nil
		}
	}
	visit := func(user uint32, u *userRollups) {
		lo, hi := u.span(from, to, !f.From.IsZero(), !f.To.IsZero())
		for _, e := range u.order[lo:hi] {
			if hasService && e.slot.service != service {
				continue
			}
			v := &e.val
			out = append(out, store.Rollup{UserID: r.names[user], ServiceID: r.names[e.slot.service],
				EndpointID: r.names[e.slot.endpoint], ProductID: r.names[e.slot.product], Hour: time.Unix(e.slot.hour, 0).UTC(),
				Calls: v.calls, Units: billing.Units(v.units), Overage: billing.Units(v.overage), Cost: billing.Units(v.cost),
				Capped: v.capped})
		}
	}
	if f.UserID != "" {
		if id, ok := r.ids[f.UserID]; ok && r.byUser[id] != nil {
			visit(id, r.byUser[id])
		}
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
// On a failed write the caller calls redo with what it returned.
func (r *rollups) frame(lastSeq uint64, full bool) (payload []byte, sent, gone []rollupRef) {
	d := newDict()
	id := func(s uint32) uint64 {
		name := r.names[s]
		if v, ok := d.ids[name]; ok {
			return v
		}
		d.add(name)
		return uint64(len(d.strs) - 1)
	}
	var body []byte
	n := 0
	put := func(user uint32, k rollKey, v *rollVal) {
		body = binary.AppendUvarint(body, id(user))
		body = binary.AppendUvarint(body, id(k.service))
		body = binary.AppendUvarint(body, id(k.endpoint))
		body = binary.AppendUvarint(body, id(k.product))
		body = binary.AppendVarint(body, k.hour)
		n++
		if v == nil {
			body = append(body, 1) // a tombstone
			return
		}
		body = append(body, 0)
		body = binary.AppendVarint(body, v.calls)
		body = binary.AppendVarint(body, v.units)
		body = binary.AppendVarint(body, v.overage)
		body = binary.AppendVarint(body, v.cost)
		body = binary.AppendVarint(body, v.capped)
	}
	// Users in their numbers' order: a frame's bytes are a function of
	// the rollups, not of the map's order (the storage simulation
	// compares two runs' disks byte for byte).
	for _, user := range slices.Sorted(maps.Keys(r.byUser)) {
		u := r.byUser[user]
		if !full && !u.dirty {
			continue
		}
		lo := u.dirtyLo
		if full {
			lo = 0
		}
		for i := lo; i < len(u.order); i++ {
			e := &u.order[i]
			if full || e.dirty {
				put(user, e.slot, &e.val)
				if e.dirty {
					sent = append(sent, rollupRef{user, e.slot})
				}
				e.dirty = false
			}
		}
		u.dirty, u.dirtyLo = false, 0
	}
	gone = r.dropped
	if !full {
		for _, g := range gone {
			put(g.user, g.slot, nil)
		}
	}
	r.dropped = nil
	b := make([]byte, framed.HeaderSize, framed.HeaderSize+len(body)+64)
	b = binary.AppendUvarint(b, lastSeq)
	b = binary.AppendUvarint(b, uint64(len(d.strs)))
	for _, s := range d.strs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(n))
	b = append(b, body...)
	framed.Put(b)
	return b, sent, gone
}

// redo puts back into the next frame what a failed write did not save.
func (r *rollups) redo(sent, gone []rollupRef) {
	for _, s := range sent {
		if u := r.byUser[s.user]; u != nil {
			if i, ok := u.index[s.slot]; ok {
				u.touch(int(i))
			}
		}
	}
	r.dropped = append(r.dropped, gone...)
}

// loadRollups replays the rollup log. A missing log is empty rollups
// covering nothing. A torn tail (framed's rule: a frame a crash cut short)
// ends the log, and tail says what it is, for the caller to cut; end says
// where the good frames end. Anything else wrong is an error naming the
// file.
func loadRollups(fsys vfs.FS, path string) (ro *rollups, lastSeq uint64, end int64, tail *framed.Error, err error) {
	ro = newRollups()
	b, err := fsys.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return ro, 0, 0, nil, nil
	}
	if err != nil {
		return nil, 0, 0, nil, err
	}
	if len(b) < len(rollupMagic) || string(b[:len(rollupMagic)]) != rollupMagic {
		return nil, 0, 0, nil, fileError(path, errors.New("not a rollup log"))
	}
	frames := framed.NewBytes(path, b, int64(len(rollupMagic)), rollupFormat)
	for {
		payload, ok := frames.Next()
		if !ok {
			break
		}
		seq, err := ro.apply(payload)
		if err != nil {
			return nil, 0, 0, nil, fileError(path, fmt.Errorf("malformed frame at offset %d", frames.Offset()))
		}
		lastSeq = seq
	}
	if err := frames.Err(); err != nil {
		if !errors.As(err, &tail) {
			return nil, 0, 0, nil, err
		}
		if !tail.Torn {
			return nil, 0, 0, nil, fileError(path, errors.New(tail.What()))
		}
	}
	for _, u := range ro.byUser {
		for i := range u.order {
			u.order[i].dirty = false
		}
		u.dirty, u.dirtyLo = false, 0
	}
	ro.dropped = nil
	return ro, lastSeq, frames.End(), tail, nil
}

// apply replays one frame.
func (ro *rollups) apply(payload []byte) (uint64, error) {
	r := colReader{rowMode: true}
	r.cols[0] = payload
	lastSeq := r.uvarint(0)
	nd := r.uvarint(0)
	ids := make([]uint32, 0, min(nd, 1<<16))
	for i := uint64(0); i < nd && r.err == nil; i++ {
		ids = append(ids, ro.intern(r.str(0)))
	}
	n := r.uvarint(0)
	name := func() uint32 {
		i := r.uvarint(0)
		if i >= uint64(len(ids)) {
			r.err = errCorrupt
			return 0
		}
		return ids[i]
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
			u, j := ro.entry(user, k)
			u.order[j].val = v
		}
	}
	if r.err != nil || len(r.cols[0]) != 0 {
		return 0, errCorrupt
	}
	return lastSeq, nil
}

// remove forgets one rollup (a tombstone in the log).
func (r *rollups) remove(user uint32, k rollKey) {
	u := r.byUser[user]
	if u == nil {
		return
	}
	i, ok := u.index[k]
	if !ok {
		return
	}
	u.order = slices.Delete(u.order, int(i), int(i)+1)
	u.reindex()
	if len(u.order) == 0 {
		delete(r.byUser, user)
	}
	r.n--
}
