package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/mochi-mqtt/server/v2/packets"
)

// drainedSubscriber connects a raw 3.1.1 client subscribed to filter at qos
// and reads (and discards) everything the broker sends it.
func drainedSubscriber(b *testing.B, addr, id, filter string, qos byte) {
	b.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	var buf bytes.Buffer
	cp := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4}
	cp.Connect = packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true}
	sp := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, ProtocolVersion: 4, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}}
	if err := errors.Join(mqttwire.EncodeTo(&buf, cp), mqttwire.EncodeTo(&buf, sp)); err != nil {
		b.Fatal(err)
	}
	if _, err := c.Write(buf.Bytes()); err != nil {
		b.Fatal(err)
	}
	ack := make([]byte, 9)
	if _, err := io.ReadFull(c, ack); err != nil {
		b.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, c) }()
}

// BenchmarkRoute measures one PUBLISH from routing to the subscribers'
// sockets: match, one delivery per subscriber, one shared encoding, and
// the writers copying it out. Allocations per op are the figure to watch.
// The retained case also replaces the topic's retained message, in memory.
func BenchmarkRoute(b *testing.B) {
	for _, retain := range []bool{false, true} {
		for _, subs := range []int{1, 10, 100} {
			name := fmt.Sprintf("subs=%d", subs)
			if retain {
				name += "/retained"
			}
			b.Run(name, func(b *testing.B) {
				tb := startBroker(b, func(o *Options) { o.MaxQueuedBytes = 256 << 20 })
				for i := 0; i < subs; i++ {
					drainedSubscriber(b, tb.Addr, fmt.Sprintf("s%d", i), "plant/+/temp", 0)
				}
				payload := []byte(`{"value":21.5,"unit":"°C"}`)
				now := time.Now()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					m := newMessage("plant/greenhouse-1/temp", payload, 0, retain, nil, now)
					tb.Broker.publish(m, matcher.NoHandle, nil)
				}
				b.StopTimer()
				if d := tb.Broker.stats.dropped.Load(); d > 0 {
					b.Logf("%d deliveries dropped (writers behind)", d)
				}
			})
		}
	}
}
