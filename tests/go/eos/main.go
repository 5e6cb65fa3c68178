// A transactional consume-transform-produce loop with franz-go: every input record becomes
// one output record ("out-" + value), exactly once. The first transaction is aborted on
// purpose (the session rewinds to the committed offsets).
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	bootstrap, in, out, group, tid := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]
	expected, _ := strconv.Atoi(os.Args[6])
	sess, err := kgo.NewGroupTransactSession(
		kgo.SeedBrokers(bootstrap),
		kgo.TransactionalID(tid),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(in),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	defer sess.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	done, aborted := 0, false
	for done < expected {
		fetches := sess.PollFetches(ctx)
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "timed out after", done)
			os.Exit(1)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			fmt.Fprintln(os.Stderr, "fetch:", errs)
			continue
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		if err := sess.Begin(); err != nil {
			fmt.Fprintln(os.Stderr, "begin:", err)
			os.Exit(1)
		}
		n := 0
		fetches.EachRecord(func(r *kgo.Record) {
			n++
			sess.Produce(ctx, &kgo.Record{Topic: out, Key: r.Key, Value: append([]byte("out-"), r.Value...)}, nil)
		})
		end := kgo.TryCommit
		if !aborted {
			end, aborted = kgo.TryAbort, true
		}
		committed, err := sess.End(ctx, end)
		if err != nil {
			fmt.Fprintln(os.Stderr, "end:", err)
			os.Exit(1)
		}
		if committed && end == kgo.TryCommit {
			done += n
		}
	}
	fmt.Println("transformed", done)
}
