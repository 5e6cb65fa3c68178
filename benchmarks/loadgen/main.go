// loadgen: many small Kafka producers and many idle connections from one process.
//
// N producer clients (each its own franz-go client, so its own connections; acks=all,
// idempotent, linger 5 ms as librdkafka's default) produce fixed-size records paced to a
// total rate, while M idle connections stay open (each completed one ApiVersions round
// trip, then sends nothing). One process with goroutines instead of N client processes
// keeps the load generator's own CPU small, so the broker under test gets the cores.
//
// Progress goes to stderr; stdout carries JSON lines: {"event": "idle_open", ...} once the
// idle connections are open, {"event": "producers_ready", ...} when every producer has
// connected (a warm-up record each, acknowledged), {"event": "producing"} when the paced
// load starts, {"event": "measuring"} when the warm-up (-warmup, full rate, not counted)
// ends and the measured window starts, and {"event": "done", ...} with the figures of the
// measured window: records issued during the warm-up are not in the latency figures (they
// are checked for failures all the same, reported as warmup_*), and new connections are
// probed only in the measured window. "ack_ms_by_second" gives p50/p99/max per second of
// the window, so a tail that comes from one burst (a pause, a neighbour's load) shows.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type options struct {
	bootstrap  string
	topic      string
	producers  int
	rate       float64
	idle       int
	seconds    float64
	size       int
	linger     time.Duration
	timeout    time.Duration
	probeEvery time.Duration
	warmup     time.Duration
}

type producerStats struct {
	mu        sync.Mutex
	latencies []float64 // ms, produce call to acknowledgement (measured window)
	issuedAt  []float64 // s into the measured window at which each of latencies was issued
	lags      []float64 // ms, how late the pacer issued the record (generator starvation)
	timedOut  int
	failed    int
	errs      map[string]int
	// Records issued during the warm-up: only their failures are kept.
	warmupAcked, warmupTimedOut, warmupFailed int
}

func emit(event string, fields map[string]any) {
	out := map[string]any{"event": event}
	for k, v := range fields {
		out[k] = v
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

func raiseFileLimit() {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
}

// apiVersionsV0 is a complete ApiVersions v0 request frame (the first request every client sends).
func apiVersionsV0(correlation int32) []byte {
	clientID := []byte("idle")
	body := make([]byte, 0, 32)
	body = binary.BigEndian.AppendUint16(body, 18) // api key ApiVersions
	body = binary.BigEndian.AppendUint16(body, 0)  // version 0
	body = binary.BigEndian.AppendUint32(body, uint32(correlation))
	body = binary.BigEndian.AppendUint16(body, uint16(len(clientID)))
	body = append(body, clientID...)
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(frame, body...)
}

func readFrame(r io.Reader) error {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(size[:])
	_, err := io.CopyN(io.Discard, r, int64(n))
	return err
}

// apiVersionsRoundTrip connects and waits for the ApiVersions answer: what a client starting now waits for.
func apiVersionsRoundTrip(addr string, keep bool) (net.Conn, time.Duration, error) {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp", addr, 60*time.Second)
	if err != nil {
		return nil, 0, err
	}
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err = c.Write(apiVersionsV0(1)); err == nil {
		err = readFrame(c)
	}
	elapsed := time.Since(t0)
	if err != nil || !keep {
		c.Close()
		return nil, elapsed, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, elapsed, nil
}

func openIdle(addr string, count int) ([]net.Conn, error) {
	conns := make([]net.Conn, count)
	errs := make(chan error, count)
	sem := make(chan struct{}, 64) // at most 64 handshakes at once, as clients starting together
	var wg sync.WaitGroup
	for i := 0; i < count; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			c, _, err := apiVersionsRoundTrip(addr, true)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
		}(i)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return conns, err
	}
	return conns, nil
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	idx := p / 100 * float64(len(sorted)-1)
	lo := int(idx)
	hi := lo + 1
	if hi >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[lo] + (sorted[hi]-sorted[lo])*(idx-float64(lo))
}

func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }

func summary(values []float64) map[string]float64 {
	sort.Float64s(values)
	if len(values) == 0 {
		return nil
	}
	return map[string]float64{
		"p50": round2(percentile(values, 50)), "p99": round2(percentile(values, 99)),
		"p999": round2(percentile(values, 99.9)), "max": round2(values[len(values)-1]),
	}
}

func newProducer(o options, i int) (*kgo.Client, error) {
	return kgo.NewClient(
		kgo.SeedBrokers(o.bootstrap),
		kgo.ClientID("loadgen-"+strconv.Itoa(i)),
		kgo.DefaultProduceTopic(o.topic),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(o.linger),
		kgo.RecordDeliveryTimeout(o.timeout),
		kgo.ProduceRequestTimeout(o.timeout),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.MetadataMinAge(time.Second),
	)
}

func main() {
	var o options
	flag.StringVar(&o.bootstrap, "bootstrap", "127.0.0.1:9092", "broker host:port")
	flag.StringVar(&o.topic, "topic", "", "topic to produce to (must exist)")
	flag.IntVar(&o.producers, "producers", 200, "producer clients (each its own connections)")
	flag.Float64Var(&o.rate, "rate", 10000, "records per second, all producers together")
	flag.IntVar(&o.idle, "idle", 5000, "idle connections")
	flag.Float64Var(&o.seconds, "seconds", 30, "how long to produce")
	flag.IntVar(&o.size, "size", 100, "record value bytes")
	flag.DurationVar(&o.linger, "linger", 5*time.Millisecond, "producer linger")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "record delivery timeout")
	flag.DurationVar(&o.probeEvery, "probe-every", 250*time.Millisecond, "new-connection probe interval")
	flag.DurationVar(&o.warmup, "warmup", 10*time.Second, "full-rate producing before the measured window (not counted)")
	flag.Parse()
	if o.topic == "" {
		fmt.Fprintln(os.Stderr, "-topic is required")
		os.Exit(2)
	}
	raiseFileLimit()

	t0 := time.Now()
	idle, err := openIdle(o.bootstrap, o.idle)
	if err != nil {
		fmt.Fprintln(os.Stderr, "opening idle connections:", err)
		os.Exit(1)
	}
	emit("idle_open", map[string]any{"count": o.idle, "seconds": round2(time.Since(t0).Seconds())})

	// Producers connect, get a producer id and learn the topic with one acknowledged warm-up record each.
	clients := make([]*kgo.Client, o.producers)
	t0 = time.Now()
	{
		var wg sync.WaitGroup
		var firstErr atomic.Value
		sem := make(chan struct{}, 32)
		for i := range clients {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				cl, err := newProducer(o, i)
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
					err = cl.ProduceSync(ctx, &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte("warm-up")}).FirstErr()
					cancel()
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
				clients[i] = cl
			}(i)
		}
		wg.Wait()
		if e := firstErr.Load(); e != nil {
			fmt.Fprintln(os.Stderr, "producer warm-up:", e)
			os.Exit(1)
		}
	}
	emit("producers_ready", map[string]any{"count": o.producers, "seconds": round2(time.Since(t0).Seconds())})

	value := make([]byte, o.size)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	stats := make([]*producerStats, o.producers)
	interval := time.Duration(float64(o.producers) / o.rate * float64(time.Second))
	measured := time.Duration(o.seconds * float64(time.Second))
	duration := o.warmup + measured
	var sent, warmupSent atomic.Int64
	start := time.Now().Add(100 * time.Millisecond)
	measureFrom := start.Add(o.warmup)
	emit("producing", map[string]any{"interval_ms": round2(float64(interval) / 1e6), "warmup_s": o.warmup.Seconds()})
	go func() {
		time.Sleep(time.Until(measureFrom))
		emit("measuring", map[string]any{"seconds": o.seconds})
	}()

	// New connections during the measured window.
	var probes []float64
	probeFailures := 0
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		time.Sleep(time.Until(measureFrom))
		for time.Since(start) < duration {
			_, d, err := apiVersionsRoundTrip(o.bootstrap, false)
			if err != nil {
				probeFailures++
			} else {
				probes = append(probes, float64(d)/1e6)
			}
			time.Sleep(o.probeEvery)
		}
	}()

	var wg sync.WaitGroup
	rng := rand.New(rand.NewSource(1))
	for i, cl := range clients {
		st := &producerStats{errs: map[string]int{}}
		stats[i] = st
		phase := time.Duration(rng.Int63n(int64(interval)))
		wg.Add(1)
		go func(i int, cl *kgo.Client, st *producerStats) {
			defer wg.Done()
			key := []byte(strconv.Itoa(i))
			for k := 0; ; k++ {
				due := start.Add(phase + time.Duration(k)*interval)
				if due.Sub(start) >= duration {
					return
				}
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				issued := time.Now()
				lag := float64(issued.Sub(due)) / 1e6
				warm := issued.Before(measureFrom)
				if warm {
					warmupSent.Add(1)
				} else {
					sent.Add(1)
				}
				cl.Produce(context.Background(), &kgo.Record{Key: key, Value: value}, func(_ *kgo.Record, err error) {
					ms := float64(time.Since(issued)) / 1e6
					st.mu.Lock()
					defer st.mu.Unlock()
					if warm {
						switch {
						case err == nil:
							st.warmupAcked++
						case errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, context.DeadlineExceeded):
							st.warmupTimedOut++
						default:
							st.warmupFailed++
							st.errs[err.Error()]++
						}
						return
					}
					st.lags = append(st.lags, lag)
					switch {
					case err == nil:
						st.latencies = append(st.latencies, ms)
						st.issuedAt = append(st.issuedAt, issued.Sub(measureFrom).Seconds())
					case errors.Is(err, kgo.ErrRecordTimeout) || errors.Is(err, context.DeadlineExceeded):
						st.timedOut++
					default:
						st.failed++
						st.errs[err.Error()]++
					}
				})
			}
		}(i, cl, st)
	}
	wg.Wait()
	produceEnd := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+30*time.Second)
	var flushWg sync.WaitGroup
	for _, cl := range clients {
		flushWg.Add(1)
		go func(cl *kgo.Client) { defer flushWg.Done(); _ = cl.Flush(ctx) }(cl)
	}
	flushWg.Wait()
	cancel()
	<-probeDone

	var lat, lags []float64
	timedOut, failed := 0, 0
	warmupAcked, warmupTimedOut, warmupFailed := 0, 0, 0
	errs := map[string]int{}
	perSecond := make([][]float64, int(o.seconds)+1)
	for _, st := range stats {
		st.mu.Lock()
		lat = append(lat, st.latencies...)
		for j, at := range st.issuedAt {
			if k := int(at); k >= 0 && k < len(perSecond) {
				perSecond[k] = append(perSecond[k], st.latencies[j])
			}
		}
		lags = append(lags, st.lags...)
		timedOut += st.timedOut
		failed += st.failed
		warmupAcked += st.warmupAcked
		warmupTimedOut += st.warmupTimedOut
		warmupFailed += st.warmupFailed
		for k, v := range st.errs {
			errs[k] += v
		}
		st.mu.Unlock()
	}
	// Idle connections the broker closed while we were producing (they should all still be open).
	closedIdle := 0
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, err := bufio.NewReader(c).Peek(1); err != nil {
			var ne net.Error
			if !(errors.As(err, &ne) && ne.Timeout()) {
				closedIdle++
			}
		}
		c.Close()
	}
	for _, cl := range clients {
		cl.Close()
	}
	notAnswered := int(sent.Load()) - len(lat) - timedOut - failed
	bySecond := make([]map[string]float64, 0, len(perSecond))
	for _, values := range perSecond {
		if len(values) > 0 {
			s := summary(values)
			bySecond = append(bySecond, map[string]float64{"p50": s["p50"], "p99": s["p99"], "max": s["max"],
				"count": float64(len(values))})
		}
	}
	emit("done", map[string]any{
		"warmup_s": o.warmup.Seconds(), "warmup_sent": warmupSent.Load(), "warmup_acked": warmupAcked,
		"warmup_timed_out": warmupTimedOut, "warmup_failed": warmupFailed, "ack_ms_by_second": bySecond,
		"producers": o.producers, "rate_rec_s": o.rate, "idle_connections": o.idle, "seconds": o.seconds,
		"sent": sent.Load(), "acked": len(lat), "timed_out": timedOut, "failed": failed, "unanswered": notAnswered,
		"errors": errs, "ack_ms": summary(lat), "pacer_lag_ms": summary(lags),
		"new_connection_ms": summary(probes), "new_connection_failures": probeFailures,
		"idle_closed_by_broker": closedIdle, "drain_s": round2(time.Since(produceEnd).Seconds()),
	})
}
