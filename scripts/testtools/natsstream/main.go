// Command natsstream reads a JetStream stream for fieldgate's reliability
// suite, which runs it as a separate process so that the firmware's module
// never depends on a NATS client. It makes (or takes up again) a durable
// consumer on the stream with explicit acknowledgement and writes every
// message it is given to standard output as one JSON line, with the
// stream's sequence number, then acknowledges it:
//
//	natsstream consume -servers nats://a,nats://b -stream NAME -durable NAME -filter SUBJECT
//
// Its first line is {"ready":true}, once the consumer exists: from then on
// the stream keeps, for the consumer, every message of the filter, which
// matters on a stream with interest retention such as NATS's own MQTT
// message stream. A message given again (its acknowledgement lost, or a
// node of the cluster restarted) comes again with the same sequence
// number; the reader tells the two apart by it. natsstream runs until it
// is sent SIGTERM or SIGINT, or its standard input closes, and carries on
// through the servers' restarts: the client reconnects to whichever node
// is up.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Line is one message as written to standard output.
type Line struct {
	Seq       uint64 `json:"seq"`       // the stream's sequence number
	Subject   string `json:"subject"`   // the subject it was stored under
	Data      string `json:"data"`      // its payload, without headers
	Delivered uint64 `json:"delivered"` // how many times the consumer has given it out
}

const (
	// batch is how many messages one pull asks for: enough that a
	// backlog of thousands drains in a few round trips.
	batch = 1000
	// pullWait is how long one pull waits for messages when there are
	// none: short, so that a stop is noticed soon.
	pullWait = time.Second
	// ackWait is how long the server waits for an acknowledgement
	// before giving a message out again. A consumer whose leader died
	// takes what the old leader had sent as given, and gives it again
	// only after ackWait, even if it never arrived: short, so that a
	// reader misses nothing for long after a node's loss; long next to
	// a loopback round trip, so that it seldom gives out again what was
	// acknowledged (which the reader tells by the sequence number).
	ackWait = 3 * time.Second
	// maxAckPending bounds what the consumer has given out and not had
	// acknowledged; a few batches.
	maxAckPending = 10 * batch
	// retryEvery spaces the attempts at an API call while the cluster
	// has no leader for the stream or the consumer.
	retryEvery = 100 * time.Millisecond
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "consume" {
		fmt.Fprintln(os.Stderr, "usage: natsstream consume -servers URLS -stream NAME -durable NAME -filter SUBJECT [-wait DURATION]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("consume", flag.ExitOnError)
	servers := fs.String("servers", nats.DefaultURL, "the cluster's client URLs, comma-separated")
	stream := fs.String("stream", "", "the stream to read")
	durable := fs.String("durable", "", "the durable consumer's name")
	filter := fs.String("filter", "", "the subject filter of the consumer; empty: the whole stream")
	wait := fs.Duration("wait", time.Minute, "how long to wait for the stream to exist and the consumer to be made")
	_ = fs.Parse(os.Args[2:])
	if *stream == "" || *durable == "" {
		fmt.Fprintln(os.Stderr, "natsstream: -stream and -durable are required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		// A parent that dies closes our standard input: stop then too.
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	if err := consume(ctx, *servers, *stream, *durable, *filter, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "natsstream:", err)
		os.Exit(1)
	}
}

func consume(ctx context.Context, servers, stream, durable, filter string, wait time.Duration) error {
	nc, err := nats.Connect(servers,
		nats.Name("natsstream"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(retryEvery),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				fmt.Fprintln(os.Stderr, "natsstream: disconnected:", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			fmt.Fprintln(os.Stderr, "natsstream: reconnected to", nc.ConnectedUrl())
		}),
	)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", servers, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var cons jetstream.Consumer
	deadline := time.Now().Add(wait)
	for {
		cons, err = makeConsumer(ctx, js, stream, durable, filter)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer %s on stream %s not made within %s: %w", durable, stream, wait, err)
		}
		time.Sleep(retryEvery)
	}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	if err := enc.Encode(map[string]bool{"ready": true}); err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return err
	}
	for ctx.Err() == nil {
		msgs, err := cons.Fetch(batch, jetstream.FetchMaxWait(pullWait))
		if err != nil {
			// No leader for the consumer yet, or the connection is
			// between servers: the next pull tries again.
			fmt.Fprintln(os.Stderr, "natsstream: fetch:", err)
			time.Sleep(retryEvery)
			continue
		}
		for m := range msgs.Messages() {
			md, err := m.Metadata()
			if err != nil {
				fmt.Fprintln(os.Stderr, "natsstream: metadata:", err)
				continue
			}
			// Written before the acknowledgement: a message the reader
			// saw is never acknowledged unseen.
			line := Line{Seq: md.Sequence.Stream, Subject: m.Subject(), Data: string(m.Data()), Delivered: md.NumDelivered}
			if err := enc.Encode(line); err != nil {
				return err
			}
			if err := out.Flush(); err != nil {
				return err
			}
			if err := m.Ack(); err != nil {
				fmt.Fprintln(os.Stderr, "natsstream: ack:", err)
			}
		}
		if err := msgs.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			fmt.Fprintln(os.Stderr, "natsstream: fetch:", err)
			time.Sleep(retryEvery)
		}
	}
	return nil
}

// makeConsumer looks the stream up and makes the durable consumer on it,
// or takes up the one a run before made.
func makeConsumer(ctx context.Context, js jetstream.JetStream, stream, durable, filter string) (jetstream.Consumer, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := js.Stream(cctx, stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	return s.CreateOrUpdateConsumer(cctx, jetstream.ConsumerConfig{
		Durable:       durable,
		FilterSubject: filter,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       ackWait,
		MaxAckPending: maxAckPending,
	})
}
