// rdyspread: go-nsq's consumer in benchmarks/bench_rdy_spread.py's drain, for comparison.
//
// It reads a topic through nsqlookupd with MaxInFlight --max-in-flight, a handler that
// sleeps --handler-ms (--max-in-flight of them at once), until --expect distinct messages
// were handled, and prints one JSON line: when the first message came, when the first
// and the last nsqd were drained (seconds from the consumer's start).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/nsqio/go-nsq"
)

type drain struct {
	mu      sync.Mutex
	started time.Time
	first   float64
	last    map[string]float64
	seen    map[string]bool
	done    chan struct{}
	expect  int
}

func (d *drain) handle(m *nsq.Message) {
	now := time.Since(d.started).Seconds()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.seen) == 0 {
		d.first = now
	}
	body := string(m.Body)
	if d.seen[body] {
		return
	}
	d.seen[body] = true
	d.last[m.NSQDAddress] = now
	if len(d.seen) == d.expect {
		close(d.done)
	}
}

func main() {
	lookupd := flag.String("lookupd", "", "nsqlookupd HTTP address")
	topic := flag.String("topic", "", "topic")
	channel := flag.String("channel", "", "channel")
	maxInFlight := flag.Int("max-in-flight", 4, "MaxInFlight (and handler goroutines)")
	handlerMs := flag.Float64("handler-ms", 5, "milliseconds each message takes")
	poll := flag.Duration("poll", 2*time.Second, "LookupdPollInterval")
	expect := flag.Int("expect", 0, "messages to handle")
	timeout := flag.Duration("timeout", 300*time.Second, "give up after this long")
	flag.Parse()

	cfg := nsq.NewConfig()
	cfg.MaxInFlight = *maxInFlight
	cfg.LookupdPollInterval = *poll
	consumer, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatal(err)
	}
	consumer.SetLogger(log.New(os.Stderr, "", log.LstdFlags), nsq.LogLevelWarning)
	d := &drain{last: map[string]float64{}, seen: map[string]bool{}, done: make(chan struct{}), expect: *expect}
	work := time.Duration(*handlerMs * float64(time.Millisecond))
	consumer.AddConcurrentHandlers(nsq.HandlerFunc(func(m *nsq.Message) error {
		d.handle(m)
		time.Sleep(work)
		return nil
	}), *maxInFlight)
	d.started = time.Now()
	if err := consumer.ConnectToNSQLookupd(*lookupd); err != nil {
		log.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(*timeout):
	}
	d.mu.Lock()
	times := []float64{}
	for _, t := range d.last {
		times = append(times, t)
	}
	handled := len(d.seen)
	first := d.first
	d.mu.Unlock()
	sort.Float64s(times)
	out := map[string]interface{}{"handled": handled, "expected": *expect, "first": first}
	if len(times) > 0 {
		out["first_drained"] = times[0]
		out["elapsed"] = times[len(times)-1]
	}
	consumer.Stop()
	select {
	case <-consumer.StopChan:
	case <-time.After(5 * time.Second):
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}
