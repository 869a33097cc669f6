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
// a file in -dir, and prints the median and p90. A durable commit of the
// store waits for fsyncs like these (bbolt makes two per commit), so the
// median bounds how fast one sync call's settlement can be acknowledged.
func runFsync(args []string) {
	fs := flag.NewFlagSet("fsync", flag.ExitOnError)
	dir := fs.String("dir", os.TempDir(), "directory on the disk to probe")
	n := fs.Int("n", 200, "writes")
	size := fs.Int("size", 4096, "bytes per write")
	fs.Parse(args)
	if *n < 1 || *size < 1 {
		fmt.Fprintln(os.Stderr, "loadgen fsync: -n and -size must be positive")
		os.Exit(2)
	}
	path := filepath.Join(*dir, "fsync-probe")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen fsync: %v\n", err)
		os.Exit(1)
	}
	defer os.Remove(path)
	defer f.Close()
	buf := bytes.Repeat([]byte{'x'}, *size)
	times := make([]time.Duration, *n)
	for i := range times {
		start := time.Now()
		// Overwrite the same block, as a commit rewrites its pages; the
		// first write also allocates it, which the median leaves out.
		if _, err := f.WriteAt(buf, 0); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen fsync: %v\n", err)
			os.Exit(1)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen fsync: %v\n", err)
			os.Exit(1)
		}
		times[i] = time.Since(start)
	}
	slices.Sort(times)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	fmt.Printf("n=%d size=%d median_ms=%.3f p90_ms=%.3f max_ms=%.3f\n",
		*n, *size, ms(times[len(times)/2]), ms(times[len(times)*9/10]), ms(times[len(times)-1]))
}
