package pgstore

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/platformgw/gateway/internal/pgtest"
	"github.com/platformgw/gateway/internal/store"
)

// silencer is a TCP proxy in front of PostgreSQL that can make the
// connection that sent LISTEN go silent (a firewall or NAT dropping an
// idle connection's packets, a proxy restarted): its bytes are dropped
// both ways, its sockets stay open, while the node's other connections
// go on.
type silencer struct {
	ln     net.Listener
	target string
	silent atomic.Bool
	wg     sync.WaitGroup
}

func newSilencer(t *testing.T, target string) *silencer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silencer{ln: ln, target: target}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		p.wg.Wait()
	})
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			var listens atomic.Bool
			p.wg.Add(2)
			go p.pipe(c, s, &listens, true)
			go p.pipe(s, c, &listens, false)
		}
	}()
	return p
}

func (p *silencer) pipe(from, to net.Conn, listens *atomic.Bool, fromClient bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if fromClient && bytes.Contains(buf[:n], []byte("LISTEN "+notifyChannel)) {
				listens.Store(true)
			}
			if !(listens.Load() && p.silent.Load()) {
				if _, werr := to.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				to.Close()
			}
			return
		}
	}
}

// A key revoked on node A is refused by node B within a second
// (docs/fleet.md, "Any node serves any request"), also when B's
// notification connection has gone silent without closing: B trusted
// its cached key a minute while it believed the connection up, and it
// noticed the silence only after a 5 s wait for a notification and a 2 s
// ping, so the revoked key went on being accepted for 5–7 s.
func TestRevocationReachesNodeWithSilentListener(t *testing.T) {
	dsn := pgtest.DB(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newSilencer(t, u.Host)
	viaProxy := *u
	viaProxy.Host = proxy.ln.Addr().String()
	a := openNode(t, dsn, "a")
	b := openNode(t, viaProxy.String(), "b")
	ctx := context.Background()
	k := store.KeyRecord{ID: "key_silent", UserID: "u", Hash: [32]byte{9, 9}, Created: time.Now()}
	if err := a.CreateKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !b.listen.up(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b does not listen")
		}
	}
	if got, err := b.KeyByHash(ctx, k.Hash); err != nil || !got.RevokedAt.IsZero() {
		t.Fatalf("b before the revocation: %+v %v", got, err)
	}
	time.Sleep(1200 * time.Millisecond) // the cached entry is older than the cache's second

	proxy.silent.Store(true)
	if _, err := a.RevokeKey(ctx, k.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for {
		got, err := b.KeyByHash(ctx, k.Hash)
		if err != nil {
			t.Fatalf("b: %v", err)
		}
		if !got.RevokedAt.IsZero() {
			t.Logf("b refuses the key %v after its revocation", time.Since(revoked).Round(time.Millisecond))
			return
		}
		if time.Since(revoked) > 2*time.Second {
			t.Fatalf("b still accepts a key revoked %v ago on a (its notification connection silent)",
				time.Since(revoked).Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
