// Command loadgen is the constant-rate load driver of `make bench` (what
// wrk2 does, which Debian does not package): requests are scheduled at a
// fixed rate whatever the server does, and each latency is measured from
// the moment its request was due, not from when a free connection sent it,
// so a stall shows up in the percentiles instead of hiding in fewer
// requests (coordinated omission). Peak throughput is measured with wrk.
//
//	loadgen rate -url URL -rate 6000 -duration 10s [-warmup 2s] [-conns 128]
//	        [-method POST] [-body TEXT] [-H 'Name: value']...
//	        [-cpu-pid PID]
//	loadgen sign -secret S -body TEXT -timestamp T
//	loadgen cputime -pid PID
//	loadgen fsync [-dir DIR] [-n 200] [-size 4096] [-mode overwrite|append|prealloc]
//
// rate prints one line: `requests=N errors=N late=N rps=R p50_ms=X
// p90_ms=X p99_ms=X max_ms=X [cpu_us=X]`; cpu_us, with -cpu-pid, is the
// CPU time (user + system, /proc/<pid>/stat) that process used per request
// served while the measured requests ran, warm-up left out; late requests were still queued 5 s after
// the schedule ended (the server could not keep up) and were not sent. sign prints Base64(HMAC-SHA256(secret, body +
// timestamp)), the signature of a backend's usage report. cputime prints a
// process's CPU time so far in microseconds. fsync prints the median time
// of a 4 KiB write plus fdatasync in DIR (`n=N size=N median_ms=X p90_ms=X
// max_ms=X`).
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: loadgen rate|sign|cputime|fsync [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "rate":
		runRate(os.Args[2:])
	case "sign":
		runSign(os.Args[2:])
	case "cputime":
		runCPUTime(os.Args[2:])
	case "fsync":
		runFsync(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "loadgen: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func runSign(args []string) {
	fs := flag.NewFlagSet("sign", flag.ExitOnError)
	secret := fs.String("secret", "", "service secret")
	body := fs.String("body", "", "exact request body")
	ts := fs.String("timestamp", "", "timestamp header value")
	fs.Parse(args)
	m := hmac.New(sha256.New, []byte(*secret))
	m.Write([]byte(*body))
	m.Write([]byte(*ts))
	fmt.Println(base64.StdEncoding.EncodeToString(m.Sum(nil)))
}

func runRate(args []string) {
	fs := flag.NewFlagSet("rate", flag.ExitOnError)
	target := fs.String("url", "", "URL to request (loopback)")
	rate := fs.Float64("rate", 1000, "requests per second")
	duration := fs.Duration("duration", 10*time.Second, "measured time")
	warmup := fs.Duration("warmup", 2*time.Second, "time at the same rate before measuring")
	conns := fs.Int("conns", 128, "most connections open at once")
	method := fs.String("method", http.MethodGet, "request method")
	body := fs.String("body", "", "request body")
	cpuPid := fs.Int("cpu-pid", 0, "also report this process's CPU time per request (cpu_us)")
	var headers headerFlags
	fs.Var(&headers, "H", "request header 'Name: value' (repeatable)")
	fs.Parse(args)
	if *target == "" || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "loadgen rate: -url and a positive -rate are needed")
		os.Exit(2)
	}
	hdr := make(http.Header)
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			fmt.Fprintf(os.Stderr, "loadgen rate: header %q is not 'Name: value'\n", h)
			os.Exit(2)
		}
		hdr.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}

	u, err := url.Parse(*target)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintf(os.Stderr, "loadgen rate: %q is not an http:// URL\n", *target)
		os.Exit(2)
	}
	req := buildRequest(*method, u, *body, hdr)
	interval := time.Duration(float64(time.Second) / *rate)
	total := int((*warmup + *duration) / interval)
	measureFrom := int(*warmup / interval)

	// Every due time goes into the queue when it comes; *conns workers
	// take them. A request that waits in the queue for a worker counts
	// its wait as latency, as a caller arriving at that moment would.
	due := make(chan time.Time, total)
	latencies := make([]time.Duration, total)
	var errs, late atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	// A server that cannot keep up leaves a queue behind; past this
	// deadline what is left counts at the latency it has already waited
	// without being sent, so a saturated run still ends in bounded time.
	deadline := start.Add(*warmup + *duration + 5*time.Second)
	for range *conns {
		wg.Go(func() {
			c := &conn{addr: u.Host, req: req}
			defer c.close()
			for t := range due {
				i := int(next.Add(1) - 1)
				if time.Now().After(deadline) {
					latencies[i] = time.Since(t)
					if i >= measureFrom {
						late.Add(1)
					}
					continue
				}
				ok := c.roundTrip()
				latencies[i] = time.Since(t)
				if !ok && i >= measureFrom {
					errs.Add(1)
				}
			}
		})
	}
	var cpuFrom time.Duration
	for i := range total {
		t := start.Add(time.Duration(i) * interval)
		if d := time.Until(t); d > 0 {
			time.Sleep(d)
		}
		if i == measureFrom && *cpuPid != 0 {
			cpuFrom = mustCPU(*cpuPid)
		}
		due <- t
	}
	close(due)
	wg.Wait()
	elapsed := time.Since(start.Add(*warmup))
	var cpuUsed time.Duration
	if *cpuPid != 0 {
		cpuUsed = mustCPU(*cpuPid) - cpuFrom
	}

	// Workers take due times in order, so the first measureFrom results
	// are (all but a few in flight at the boundary) the warm-up ones.
	measured := latencies[measureFrom:]
	slices.Sort(measured)
	pct := func(p float64) float64 {
		if len(measured) == 0 {
			return 0
		}
		i := min(int(p*float64(len(measured))), len(measured)-1)
		return float64(measured[i]) / float64(time.Millisecond)
	}
	served := len(measured) - int(late.Load())
	fmt.Printf("requests=%d errors=%d late=%d rps=%.0f p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f max_ms=%.3f",
		len(measured), errs.Load(), late.Load(), float64(served)/elapsed.Seconds(),
		pct(0.50), pct(0.90), pct(0.99), pct(1))
	if *cpuPid != 0 && served > 0 {
		fmt.Printf(" cpu_us=%.1f", float64(cpuUsed.Microseconds())/float64(served))
	}
	fmt.Println()
}

func mustCPU(pid int) time.Duration {
	d, err := processCPU(pid)
	if err != nil {
		fmt.Fprintf(os.Stderr, "loadgen rate: CPU time of process %d: %v\n", pid, err)
		os.Exit(1)
	}
	return d
}
