// A member of a share group (KIP-932) using franz-go's kgo: prints "R offset value
// deliveryCount" for each record. Mode "ack" accepts every record; mode "hold" keeps the
// first records it gets without acknowledging them and stops polling, so only their
// acquisition lock timing out makes them available to others. Runs for the given seconds.
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
	bootstrap, topic, group, mode := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	seconds, _ := strconv.Atoi(os.Args[5])
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(bootstrap),
		kgo.ShareGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ShareMaxRecords(20),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cl.Close()
	fmt.Println("STARTED")
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		fetches := cl.PollFetches(ctx)
		cancel()
		got := 0
		fetches.EachRecord(func(r *kgo.Record) {
			got++
			fmt.Printf("R %d %s %d\n", r.Offset, string(r.Value), r.DeliveryCount())
			if mode == "ack" {
				r.Ack(kgo.AckAccept)
			}
		})
		if mode == "ack" && got > 0 {
			if err := cl.FlushAcks(context.Background()); err != nil {
				fmt.Fprintln(os.Stderr, "flush acks:", err)
			}
		}
		if mode == "hold" && got > 0 {
			time.Sleep(time.Until(deadline))
			os.Exit(0) // without Close: the held records are never acknowledged
		}
	}
	fmt.Println("DONE")
}
