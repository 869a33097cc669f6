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

// rollupFile holds the hourly rollups and the last sequence number they
// cover. It is rewritten whole (through a .tmp and a rename) when a
// segment is sealed, before a prune and at Close; what was appended after
// it is replayed from the raw rows at Open, so the rollups always equal
// the sum of the rows, crash or not.
const (
	rollupFile  = "rollups.dat"
	rollupMagic = "PLGROL01"
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
	key rollKey
	val rollVal
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
	e := &rollEntry{key: k}
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
	v := &r.entry(e.UserID, rollKey{service: e.ServiceID, endpoint: e.EndpointID, product: e.ProductID, hour: hourOf(e.Time)}).val
	v.calls++
	v.units = satAdd(v.units, int64(e.Units))
	v.overage = satAdd(v.overage, int64(e.Overage))
	v.cost = satAdd(v.cost, int64(e.Cost))
	if e.UnitsClaimed != 0 {
		v.capped++
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

// encode writes the rollups as the file holds them, covering rows up to
// lastSeq.
func (r *rollups) encode(lastSeq uint64) []byte {
	d := newDict()
	var pending []string
	id := func(s string) uint64 {
		v := d.lookup(s, &pending)
		if len(pending) > 0 {
			d.add(pending[0])
			pending = pending[:0]
		}
		return v
	}
	var body []byte
	for user, u := range r.byUser {
		for _, e := range u.order {
			k, v := e.key, &e.val
			body = binary.AppendUvarint(body, id(user))
			body = binary.AppendUvarint(body, id(k.service))
			body = binary.AppendUvarint(body, id(k.endpoint))
			body = binary.AppendUvarint(body, id(k.product))
			body = binary.AppendVarint(body, k.hour)
			body = binary.AppendVarint(body, v.calls)
			body = binary.AppendVarint(body, v.units)
			body = binary.AppendVarint(body, v.overage)
			body = binary.AppendVarint(body, v.cost)
			body = binary.AppendVarint(body, v.capped)
		}
	}
	b := append([]byte(nil), rollupMagic...)
	b = binary.AppendUvarint(b, lastSeq)
	b = binary.AppendUvarint(b, uint64(len(d.strs)))
	for _, s := range d.strs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(r.n))
	b = append(b, body...)
	return binary.LittleEndian.AppendUint32(b, crc(b))
}

// loadRollups reads the rollup file; a missing file is empty rollups
// covering nothing.
func loadRollups(path string) (*rollups, uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return newRollups(), 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	if len(b) < len(rollupMagic)+4 || string(b[:len(rollupMagic)]) != rollupMagic ||
		crc(b[:len(b)-4]) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return nil, 0, fileError(path, errors.New("checksum mismatch"))
	}
	r := colReader{rowMode: true}
	r.cols[0] = b[len(rollupMagic) : len(b)-4]
	lastSeq := r.uvarint(0)
	nd := r.uvarint(0)
	strs := make([]string, 0, min(nd, 1<<16))
	for i := uint64(0); i < nd && r.err == nil; i++ {
		strs = append(strs, r.str(0))
	}
	n := r.uvarint(0)
	ro := newRollups()
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
		v := rollVal{calls: r.varint(0), units: r.varint(0), overage: r.varint(0), cost: r.varint(0), capped: r.varint(0)}
		if r.err == nil {
			ro.entry(user, k).val = v
		}
	}
	if r.err != nil || len(r.cols[0]) != 0 {
		return nil, 0, fileError(path, fmt.Errorf("malformed rollups"))
	}
	return ro, lastSeq, nil
}
