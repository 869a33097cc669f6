package e2e

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// crashEchoOutcomes sums the call outcome rows (internal/store/boltstore/
// outcomes.go) of the crash service's sync endpoint in the store file at
// path, read with bbolt alone: the calls, and the calls per outcome.
func crashEchoOutcomes(t *testing.T, path string) (int64, map[string]int64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("open store file %s: %v", path, err)
	}
	defer db.Close()
	var total int64
	by := map[string]int64{}
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("outcomes"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			// hour(8) user \0 service \0 endpoint \0 product \0 outcome
			parts := bytes.Split(k[8:], []byte{0})
			if len(parts) != 5 || string(parts[1]) != crashService || string(parts[2]) != "echo" {
				return nil
			}
			calls := int64(binary.BigEndian.Uint64(recordPayload(k, v)))
			total += calls
			by[string(parts[4])] += calls
			return nil
		})
	})
	if err != nil {
		t.Fatalf("read outcomes of %s: %v", path, err)
	}
	return total, by
}

// checkCrashOutcomes: after the rounds of kill -9 and a graceful stop, the
// sync invokes counted in the call outcomes are never more than the
// invokes sent (a batch is never counted twice, whatever the kills cut
// short) and at least the last one, which the graceful stop flushed; a
// kill loses what its process had not flushed yet, by design.
func checkCrashOutcomes(t *testing.T, path string, sent int) {
	t.Helper()
	total, by := crashEchoOutcomes(t, path)
	if total > int64(sent) || total < 1 {
		t.Errorf("call outcomes count %d sync invokes (%v), of %d sent: want 1 to %d", total, by, sent, sent)
	}
	t.Logf("call outcomes: %d of %d sync invokes counted (%v); the rest were unflushed at a kill", total, sent, by)
}

// readOutcomesMeanwhile reads the outcome summary from the admin API at
// admin every 50 ms until the returned stop is called: each read flushes
// the process's counts, so kills land before, during and after flushes.
// Errors are expected once the process is killed, and ignored.
func readOutcomesMeanwhile(admin string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 2 * time.Second}
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if resp, err := client.Get(admin + "/platform/outcomes/summary?by=outcome"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
