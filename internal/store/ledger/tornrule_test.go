package ledger

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/platformgw/gateway/internal/store"
	"github.com/platformgw/gateway/internal/store/framed"
)

// TestTornTailRule: the active segment and the rollup log follow framed's
// one rule. A torn tail (zeros where a write never landed, a last block
// whose checksum fails) is cut, with a warning naming the file and the
// fault; a bad block with more than zeros after it is damage, refused
// with the file and the offset and left as it is, even when what follows
// it does not read either (which the ledger used to take for a torn tail).
func TestTornTailRule(t *testing.T) {
	build := func(t *testing.T) (dir, active string, es []store.LedgerEntry, ends []int64) {
		dir = t.TempDir()
		l := open(t, dir, Options{})
		var pos uint64
		for i := range 10 {
			e := syncEntry(uint64(i+1), t0.Add(time.Duration(i)*time.Second))
			pos++
			if err := l.Append([]store.LedgerEntry{e}, pos); err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
			ends = append(ends, l.segs[0].size)
		}
		active = l.segs[0].path
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return dir, active, es, ends
	}
	openLogged := func(t *testing.T, dir string) (*Ledger, *observer.ObservedLogs, error) {
		core, logs := observer.New(zapcore.WarnLevel)
		l, err := Open(dir, Options{Logger: zap.New(core)})
		return l, logs, err
	}
	edit := func(t *testing.T, path string, fn func([]byte) []byte) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = fn(b)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return b
	}
	cut := func(t *testing.T, what, path string, logs *observer.ObservedLogs, want int64) {
		t.Helper()
		if fi, err := os.Stat(path); err != nil || fi.Size() != want {
			t.Errorf("%s: %s not cut to %d bytes (%v, %v)", what, path, want, fi, err)
		}
		warned := false
		for _, e := range logs.All() {
			f := e.ContextMap()
			fault, _ := f["fault"].(string)
			warned = warned || (strings.Contains(e.Message, "torn") && f["file"] == path && fault != "")
		}
		if !warned {
			t.Errorf("%s: no warning naming %s and the fault: %v", what, path, logs.All())
		}
	}

	t.Run("zeros after the last block", func(t *testing.T) {
		dir, active, es, ends := build(t)
		edit(t, active, func(b []byte) []byte { return append(b, make([]byte, 4096)...) })
		l, logs, err := openLogged(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cut(t, "zeros", active, logs, ends[9])
		sameEntries(t, "after the zeros went", scanAll(t, l, store.LedgerFilter{}), es)
	})
	t.Run("the last block garbled", func(t *testing.T) {
		dir, active, es, ends := build(t)
		edit(t, active, func(b []byte) []byte { b[len(b)-3] ^= 0x10; return b })
		l, logs, err := openLogged(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cut(t, "a garbled last block", active, logs, ends[8])
		sameEntries(t, "after the torn block went", scanAll(t, l, store.LedgerFilter{}), es[:9])
	})
	t.Run("a bad block and garbage after it", func(t *testing.T) {
		dir, active, _, ends := build(t)
		damaged := edit(t, active, func(b []byte) []byte {
			b[ends[0]+framed.HeaderSize+2] ^= 0x10 // the second block
			b[ends[1]+framed.HeaderSize+2] ^= 0x10 // and the third
			return b
		})
		_, err := Open(dir, Options{})
		if err == nil || !strings.Contains(err.Error(), active) || !strings.Contains(err.Error(), "bad checksum") ||
			!strings.Contains(err.Error(), "offset "+strconv.FormatInt(ends[0], 10)) {
			t.Fatalf("Open = %v; want damage in %s at offset %d", err, active, ends[0])
		}
		if now, _ := os.ReadFile(active); !bytes.Equal(now, damaged) {
			t.Error("the damaged segment changed")
		}
	})
	t.Run("zeros after the rollup log's last frame", func(t *testing.T) {
		dir, _, es, _ := build(t)
		path := filepath.Join(dir, rollupFile)
		before := edit(t, path, func(b []byte) []byte { return append(b, make([]byte, 100)...) })
		l, logs, err := openLogged(t, dir)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		cut(t, "zeros in the rollup log", path, logs, int64(len(before)-100))
		checkRollups(t, "after the zeros went", l)
		sameEntries(t, "rows", scanAll(t, l, store.LedgerFilter{}), es)
	})
}
