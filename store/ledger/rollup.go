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

// rollups are kept in memory by user, so a user's summary reads only that
// user's rollups. Each is about 100 bytes; see docs/operations.md for the
// arithmetic.
type rollups struct {
	byUser map[string]map[rollKey]*rollVal
	n      int
}

func newRollups() *rollups { return &rollups{byUser: make(map[string]map[rollKey]*rollVal)} }

func hourOf(t time.Time) int64 {
	s := t.Unix()
	h := s - s%3600
	if s%3600 < 0 {
		h -= 3600
	}
	return h
}

func (r *rollups) add(e *store.LedgerEntry) {
	u := r.byUser[e.UserID]
	if u == nil {
		u = make(map[rollKey]*rollVal)
		r.byUser[e.UserID] = u
	}
	k := rollKey{service: e.ServiceID, endpoint: e.EndpointID, product: e.ProductID, hour: hourOf(e.Time)}
	v := u[k]
	if v == nil {
		v = &rollVal{}
		u[k] = v
		r.n++
	}
	v.calls++
	v.units = satAdd(v.units, int64(e.Units))
	v.overage = satAdd(v.overage, int64(e.Overage))
	v.cost = satAdd(v.cost, int64(e.Cost))
	if e.UnitsClaimed != 0 {
		v.capped++
	}
}

// dropBefore forgets the rollups of hours before cutoff.
func (r *rollups) dropBefore(cutoff int64) int {
	dropped := 0
	for user, u := range r.byUser {
		for k := range u {
			if k.hour < cutoff {
				delete(u, k)
				dropped++
			}
		}
		if len(u) == 0 {
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
		from = f.From.Unix()
	}
	if !f.To.IsZero() {
		to = f.To.Unix()
	}
	visit := func(user string, u map[rollKey]*rollVal) {
		for k, v := range u {
			if (f.ServiceID != "" && k.service != f.ServiceID) || (!f.From.IsZero() && k.hour < from) ||
				(!f.To.IsZero() && k.hour >= to) {
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
		for k, v := range u {
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
		v := &rollVal{calls: r.varint(0), units: r.varint(0), overage: r.varint(0), cost: r.varint(0), capped: r.varint(0)}
		u := ro.byUser[user]
		if u == nil {
			u = make(map[rollKey]*rollVal)
			ro.byUser[user] = u
		}
		u[k] = v
		ro.n++
	}
	if r.err != nil || len(r.cols[0]) != 0 {
		return nil, 0, fileError(path, fmt.Errorf("malformed rollups"))
	}
	return ro, lastSeq, nil
}
