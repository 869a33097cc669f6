package settlelog

import (
	"testing"
)

// benchRecord is about the size of a sync call's settlement record.
var benchRecord = make([]byte, 180)

// BenchmarkAppendWrite is the hot path of a sync call in write mode: one
// Append, framed and written before it returns. It must not allocate.
func BenchmarkAppendWrite(b *testing.B) {
	l, err := Open(storeFile(b), Options{Mode: Write})
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Start(0); err != nil {
		b.Fatal(err)
	}
	defer l.Close(0)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchRecord)))
	for b.Loop() {
		if _, _, err := l.Append(benchRecord); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendBatch is sync mode's part of the hot path without the
// fdatasync: records framed into the pending batch. The batch's buffer is
// reused, so a record costs no allocation.
func BenchmarkAppendBatch(b *testing.B) {
	l, err := Open(storeFile(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	// Not started: no flusher takes the batch, so the benchmark measures
	// the framing alone; the batch is dropped every 4096 records.
	l.end = 0
	b.ReportAllocs()
	b.SetBytes(int64(len(benchRecord)))
	n := 0
	for b.Loop() {
		if _, _, err := l.Append(benchRecord); err != nil {
			b.Fatal(err)
		}
		if n++; n%4096 == 0 {
			l.mu.Lock()
			l.spare, l.batch = l.batch.buf[:0], nil
			l.mu.Unlock()
		}
	}
}

// BenchmarkReplay reads a segment back at start: no copy per record.
func BenchmarkReplay(b *testing.B) {
	path := storeFile(b)
	l := appendAll(b, path, Options{Mode: Write}, 0)
	for range 2000 {
		if _, _, err := l.Append(benchRecord); err != nil {
			b.Fatal(err)
		}
	}
	l.Close(0)
	r, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if err := r.Replay(0, func(uint64, []byte) error { n++; return nil }); err != nil || n != 2000 {
			b.Fatal(n, err)
		}
	}
}
