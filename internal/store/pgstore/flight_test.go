package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// stallProxy is a TCP proxy in front of PostgreSQL that, once armed,
// holds back the first answer from the server containing marker: the
// server has run the query (its snapshot is taken) but the node does not
// have the answer yet, a slow network's round trip made long at will.
type stallProxy struct {
	addr    string
	mu      sync.Mutex
	marker  []byte
	held    chan struct{} // closed when the answer is held
	release chan struct{} // closed to let it through
	once    sync.Once
}

func (p *stallProxy) let() { p.once.Do(func() { close(p.release) }) }

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{addr: ln.Addr().String(), release: make(chan struct{})}
	t.Cleanup(func() { p.let(); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				go func() { io.Copy(u, c); u.Close() }()
				buf := make([]byte, 64<<10)
				for {
					n, err := u.Read(buf)
					if n > 0 {
						if p.hold(buf[:n]) {
							<-p.release
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	return p
}

// arm makes the proxy hold the next answer that contains marker.
func (p *stallProxy) arm(marker string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker, p.held = []byte(marker), make(chan struct{})
	return p.held
}

func (p *stallProxy) hold(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.marker == nil || !bytes.Contains(b, p.marker) {
		return false
	}
	p.marker = nil
	close(p.held)
	return true
}

// dsn is dsn through the proxy.
func (p *stallProxy) dsn(t *testing.T, dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr
	return u.String()
}

func (c *readCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// heard runs change (made on another node) once b listens, and waits
// until b has heard of it.
func heard(t *testing.T, b *Store, change func()) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !b.listen.up(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b does not listen")
		}
	}
	g := b.cache.generation()
	change()
	for deadline := time.Now().Add(5 * time.Second); b.cache.generation() == g; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b never heard of the change")
		}
	}
}

// raceRead runs a lookup on b that the proxy holds after the database
// answered it, changes the record on a (changed: wait until b hears),
// then looks up again on b: that lookup starts after b dropped the
// record, so it must not be given the read that began before the change.
func raceRead[T any](t *testing.T, p *stallProxy, b *Store, marker string, read func() (T, error), change func()) (first, second T) {
	t.Helper()
	held := p.arm(marker)
	type res struct {
		v   T
		err error
	}
	lead := make(chan res, 1)
	go func() { v, err := read(); lead <- res{v, err} }()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the first read never reached the database")
	}
	heard(t, b, change)
	late := make(chan res, 1)
	go func() { v, err := read(); late <- res{v, err} }()
	var r res
	got := false
	select {
	case r, got = <-late: // read on its own
	case <-time.After(300 * time.Millisecond): // waiting on the held read
	}
	p.let()
	if !got {
		r = <-late
	}
	l := <-lead
	if l.err != nil || r.err != nil {
		t.Fatalf("reads: %v, %v", l.err, r.err)
	}
	return l.v, r.v
}

// A lookup that starts after a node heard of a key's revocation is
// refused, even while a read of the key that began before the revocation
// committed is still on its way back.
func TestKeyReadAfterRevocationNotShared(t *testing.T) {
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a")
	p := startStallProxy(t, (func() string { u, _ := url.Parse(dsn); return u.Host })())
	b := openNode(t, p.dsn(t, dsn), "b")
	ctx := context.Background()
	h := sha256.Sum256([]byte("sk_race"))
	heard(t, b, func() {
		if err := a.CreateKey(ctx, store.KeyRecord{ID: "key_race_victim", Hash: h, UserID: "u", Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	})
	_, late := raceRead(t, p, b, "key_race_victim",
		func() (store.KeyRecord, error) { return b.KeyByHash(ctx, h) },
		func() {
			if _, err := a.RevokeKey(ctx, "key_race_victim", time.Now()); err != nil {
				t.Fatal(err)
			}
		})
	if late.RevokedAt.IsZero() {
		t.Fatal("a lookup that began after the revocation reached b was given the key unrevoked")
	}
	if k, err := b.KeyByHash(ctx, h); err != nil || k.RevokedAt.IsZero() {
		t.Fatalf("after the race: %+v, %v", k, err)
	}
}

// The same for a subscription cancelled on another node.
func TestSubscriptionReadAfterChangeNotShared(t *testing.T) {
	dsn := pgtest.DB(t)
	a := openNode(t, dsn, "a")
	p := startStallProxy(t, (func() string { u, _ := url.Parse(dsn); return u.Host })())
	b := openNode(t, p.dsn(t, dsn), "b")
	ctx := context.Background()
	heard(t, b, func() { subscribe(t, a, "race_user", "svc", "pp") })
	_, late := raceRead(t, p, b, "race_user",
		func() (store.Subscription, error) { return b.GetSubscription(ctx, "race_user", "svc") },
		func() {
			now := time.Now().UTC()
			if _, err := a.PutSubscription(ctx, store.Subscription{UserID: "race_user", ServiceID: "svc", ProductID: "pp",
				Status: "CANCELLED", UpdatedAt: now}); err != nil {
				t.Fatal(err)
			}
		})
	if late.Status != "CANCELLED" {
		t.Fatalf("a lookup that began after the cancellation reached b was given the subscription %s", late.Status)
	}
}
