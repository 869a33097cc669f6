package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat. Linux
// reports them in USER_HZ, which is 100 on every architecture Go runs on
// (sysconf(_SC_CLK_TCK)); a different value would show as an absurd
// CPU per request, not as a subtle error.
const clockTick = 10 * time.Millisecond

// processCPU is the CPU time a process has used so far, user plus system,
// all its threads: fields 14 and 15 of /proc/<pid>/stat (proc(5)).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces;
	// the fields after the last ')' start with field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	utime, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	stime, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unexpected /proc stat format")
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// runCPUTime prints a process's CPU time so far in microseconds, for the
// peak runs, which wrk drives: the script reads it before and after.
func runCPUTime(args []string) {
	fs := flag.NewFlagSet("cputime", flag.ExitOnError)
	pid := fs.Int("pid", 0, "process id")
	fs.Parse(args)
	d, err := processCPU(*pid)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen cputime: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(d.Microseconds())
}

// runFsync times -n writes of -size bytes, each followed by fdatasync, to
// a file in -dir, and prints the median and p90 and the process's CPU time
// per write. A durable commit of the store waits for fsyncs like these, so
// the median bounds how fast one sync call's settlement can be
// acknowledged. -mode says where the writes go: "overwrite" (the default)
// rewrites the same block, as a bbolt commit rewrites its pages; "append"
// appends, as the settlement log does (each fdatasync then also commits
// the file's new size and blocks); "prealloc" writes the same sequence
// into a file written full of zeros first (the size and blocks already
// committed: what a preallocated log segment would cost).
func runFsync(args []string) {
	fs := flag.NewFlagSet("fsync", flag.ExitOnError)
	dir := fs.String("dir", os.TempDir(), "directory on the disk to probe")
	n := fs.Int("n", 200, "writes")
	size := fs.Int("size", 4096, "bytes per write")
	mode := fs.String("mode", "overwrite", "overwrite, append or prealloc")
	fs.Parse(args)
	if *n < 1 || *size < 1 {
		fmt.Fprintln(os.Stderr, "loadgen fsync: -n and -size must be positive")
		os.Exit(2)
	}
	if *mode != "overwrite" && *mode != "append" && *mode != "prealloc" {
		fmt.Fprintln(os.Stderr, "loadgen fsync: -mode must be overwrite, append or prealloc")
		os.Exit(2)
	}
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "loadgen fsync: %v\n", err)
		os.Exit(1)
	}
	path := filepath.Join(*dir, "fsync-probe")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		fail(err)
	}
	defer os.Remove(path)
	defer f.Close()
	if *mode == "prealloc" {
		if _, err := f.Write(make([]byte, *n**size)); err != nil {
			fail(err)
		}
		if err := f.Sync(); err != nil {
			fail(err)
		}
	}
	buf := bytes.Repeat([]byte{'x'}, *size)
	times := make([]time.Duration, *n)
	cpu0, err := selfCPU()
	if err != nil {
		fail(err)
	}
	for i := range times {
		start := time.Now()
		off := int64(0) // overwrite: the first write also allocates the block, which the median leaves out
		if *mode != "overwrite" {
			off = int64(i) * int64(*size)
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			fail(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			fail(err)
		}
		times[i] = time.Since(start)
	}
	cpu1, err := selfCPU()
	if err != nil {
		fail(err)
	}
	slices.Sort(times)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Printf("n=%d size=%d mode=%s median_ms=%.3f p90_ms=%.3f max_ms=%.3f cpu_us_per_write=%.1f\n",
		*n, *size, *mode, ms(times[len(times)/2]), ms(times[len(times)*9/10]), ms(times[len(times)-1]),
		float64((cpu1-cpu0).Microseconds())/float64(*n))
}

// selfCPU is this process's user + system CPU time so far.
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
