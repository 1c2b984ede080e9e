// Command loadgen is bench/router_overhead.py's client: a closed loop of C workers, each sending its next
// completion as soon as its last one is answered, spread round-robin over one front's URLs. It is written in Go so
// that the client costs the machine little and on both cores: a Python client spends about as much CPU per request
// as the fronts it measures, and its own queue of answers to read becomes part of every front's latency.
//
//	loadgen -c 64 -n 1600 http://127.0.0.1:8080 [URL ...]
//
// One warm-up request per worker first (it opens the connection the measured run reuses; not measured), then -n
// requests. Prints one JSON object: p50_ms, p99_ms, rps, requests, errors (non-200 answers and failed requests).
// It runs on one core by default (-procs): with more, the Go scheduler's idle threads spin on the cores the fronts
// and shards need, and the client costs more CPU per request, not less.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

type result struct {
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	RPS      float64 `json:"rps"`
	Requests int     `json:"requests"`
	Errors   int64   `json:"errors"`
}

func main() {
	concurrency := flag.Int("c", 64, "requests in flight (workers)")
	requests := flag.Int("n", 1600, "measured requests")
	timeout := flag.Duration("timeout", 120*time.Second, "per-request timeout (a hung front fails its requests)")
	procs := flag.Int("procs", 1, "OS threads running Go code at once (GOMAXPROCS)")
	model := flag.String("model", "", "the body's \"model\" (omitted when empty; some routers require it)")
	flag.Parse()
	runtime.GOMAXPROCS(*procs)
	urls := flag.Args()
	if len(urls) == 0 || *concurrency < 1 || *requests < 1 || *procs < 1 {
		fmt.Fprintln(os.Stderr, "usage: loadgen [-c N] [-n N] [-procs N] [-timeout D] [-model NAME] URL [URL ...]")
		os.Exit(2)
	}
	client := &http.Client{
		Timeout: *timeout,
		Transport: &http.Transport{
			MaxIdleConnsPerHost: *concurrency, DisableCompression: true, IdleConnTimeout: time.Minute,
		},
	}
	modelField := ""
	if *model != "" {
		quoted, _ := json.Marshal(*model)
		modelField = fmt.Sprintf(`"model": %s, `, quoted)
	}
	var errors int64
	send := func(i int64) {
		body := fmt.Sprintf(`{%s"prompt": "What is %d + 1?", "max_tokens": 4}`, modelField, i)
		resp, err := client.Post(urls[i%int64(len(urls))]+"/v1/completions", "application/json", bytes.NewBufferString(body))
		if err != nil {
			atomic.AddInt64(&errors, 1)
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			atomic.AddInt64(&errors, 1)
		}
	}
	// run sends total requests from the workers; latencies, if not nil, gets each one's seconds.
	run := func(total int64, latencies []float64) {
		next := int64(-1)
		var wg sync.WaitGroup
		for w := 0; w < *concurrency; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := atomic.AddInt64(&next, 1); i < total; i = atomic.AddInt64(&next, 1) {
					started := time.Now()
					send(i)
					if latencies != nil {
						latencies[i] = time.Since(started).Seconds()
					}
				}
			}()
		}
		wg.Wait()
	}
	run(int64(*concurrency), nil)
	errors = 0
	latencies := make([]float64, *requests)
	started := time.Now()
	run(int64(*requests), latencies)
	wall := time.Since(started).Seconds()
	sort.Float64s(latencies)
	at := func(q float64) float64 { return latencies[int(q*float64(len(latencies)-1)+0.5)] * 1000 }
	out := result{at(0.5), at(0.99), float64(*requests) / wall, *requests, errors}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
