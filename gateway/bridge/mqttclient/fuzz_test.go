package mqttclient

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/wiretest"
	"github.com/fieldgate/fieldgate/matcher"
)

// fuzzWait bounds every wait of the fuzz targets: on loopback the client
// needs milliseconds, so seconds mean it never will.
var fuzzWait = testkit.Scale(5 * time.Second)

// fuzzServerWait is how long the fake upstream waits for the client's
// publishes and SUBSCRIBE before it sends the rest of its stream.
const fuzzServerWait = 300 * time.Millisecond

// FuzzClientStream plays an upstream broker that answers the bridge
// client's CONNECT with arbitrary bytes. The first input byte picks the
// protocol (even: MQTT 5, odd: 3.1.1); the stream's first packet goes out
// at once, as the CONNACK would, and the rest once the client has queued
// its QoS 1 and QoS 2 publishes and a SUBSCRIBE; then the server closes
// its side. The client must not panic; Dial must fail or succeed within its
// timeout; once the server is gone the connection must end, with an
// error, and every publish Publish accepted must have had its done
// callback exactly once; OnMessage must only see valid topics at QoS 0-2.
//
//	go test -run '^$' -fuzz FuzzClientStream -fuzztime 15s ./gateway/bridge
func FuzzClientStream(f *testing.F) {
	connack5 := []byte{0x20, 3, 0, 0, 0}
	connack3 := []byte{0x20, 2, 0, 0}
	publish := func(flags byte, topic string, pid uint16, props []byte, payload string) []byte {
		parts := [][]byte{wiretest.Str(topic)}
		if flags&6 != 0 {
			parts = append(parts, []byte{byte(pid >> 8), byte(pid)})
		}
		return wiretest.Frame(0x30|flags, append(parts, props, []byte(payload))...)
	}
	join := func(v byte, pkts ...[]byte) []byte { return append([]byte{v}, bytes.Join(pkts, nil)...) }
	f.Add(join(0, connack5))
	f.Add(join(1, connack3))
	// Acknowledgements for the client's publishes (ids 1 and 2) and its
	// SUBSCRIBE (id 3), messages at every QoS, a PUBREL, a PINGRESP.
	f.Add(join(0,
		[]byte{0x20, 9, 0, 0, 6, 0x21, 0, 1, 0x24, 1, 0x25, 0},
		[]byte{0x40, 2, 0, 1}, []byte{0x50, 2, 0, 2}, []byte{0x70, 2, 0, 2},
		[]byte{0x90, 4, 0, 3, 0, 1},
		publish(0, "down/a", 0, []byte{0}, "zero"),
		publish(2, "down/b", 7, []byte{2, 0x0B, 5}, "one"),
		publish(4, "down/c", 8, []byte{0}, "two"),
		publish(4, "down/c", 8, []byte{0}, "two again"),
		[]byte{0x62, 2, 0, 8}, []byte{0x62, 2, 0, 9},
		[]byte{0xD0, 0},
		[]byte{0xE0, 2, 0x8B, 0},
	))
	f.Add(join(1,
		connack3, []byte{0x40, 2, 0, 1}, []byte{0x50, 2, 0, 2}, []byte{0x70, 2, 0, 2}, []byte{0x90, 3, 0, 3, 1},
		publish(2, "down/x", 1, nil, "x"), []byte{0xE0, 0},
	))
	// Refusals, a session present, and server properties.
	f.Add(join(0, []byte{0x20, 3, 0, 0x87, 0}))
	f.Add(join(0, []byte{0x20, 3, 0, 0x01, 0}))
	f.Add(join(1, []byte{0x20, 2, 0, 5}))
	f.Add(join(0, wiretest.Frame(0x20, []byte{1, 0}, []byte{13, 0x27, 0, 0, 0, 32, 0x13, 0, 1, 0x12}, wiretest.Str("id")[:2])))
	// Broken streams: a PUBLISH with a topic alias, with a wildcard, QoS 1
	// without an id, a PUBACK cut short, a reserved type, a 5-byte length,
	// a DISCONNECT with a reason string.
	f.Add(join(0, connack5, publish(0, "a", 0, []byte{3, 0x23, 0, 1}, "x")))
	f.Add(join(0, connack5, publish(0, "a/+", 0, []byte{0}, "x")))
	f.Add(join(0, connack5, publish(2, "a", 0, []byte{0}, "x")))
	f.Add(join(0, connack5, []byte{0x40, 1, 0}))
	f.Add(join(0, connack5, []byte{0x00, 0}))
	f.Add(join(0, connack5, []byte{0x30, 0x80, 0x80, 0x80, 0x80, 0x01}))
	f.Add(join(0, connack5, wiretest.Frame(0xE0, []byte{0x97}, []byte{5, 0x1F}, wiretest.Str("no"))))
	f.Add(join(1, connack3, []byte{0xE0, 0}))
	f.Add(join(0, []byte{0x30, 0}))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { ln.Close() })

	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		version := byte(5)
		if data[0]&1 == 1 {
			version = 4
		}
		served, ready := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(served)
			fuzzServe(ln, data[1:], ready)
		}()
		defer func() {
			select {
			case <-served:
			case <-time.After(fuzzWait):
				t.Errorf("the fake upstream still runs %v after the client ended", fuzzWait)
			}
		}()

		var mu sync.Mutex
		var bad []string
		o := Options{
			Address:        ln.Addr().String(),
			ClientID:       "fuzz",
			Protocol:       version,
			ConnectTimeout: 2 * time.Second,
			AckTimeout:     2 * time.Second,
			OnMessage: func(m *Incoming) {
				if matcher.ValidateTopic(m.Topic) != nil || m.QoS > 2 {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%q at QoS %d", m.Topic, m.QoS))
					mu.Unlock()
				}
			},
		}
		start := time.Now()
		c, err := Dial(context.Background(), o)
		if err != nil {
			close(ready)
			if d := time.Since(start); d > o.ConnectTimeout+time.Second {
				t.Fatalf("Dial took %v to fail, past its %v timeout: %v", d, o.ConnectTimeout, err)
			}
			return
		}
		defer c.Close()

		calls := make([]int, 2)
		accepted := make([]bool, 2)
		for i, qos := range []byte{1, 2} {
			_, err := c.Publish(&Outgoing{Topic: "up/fuzz", Payload: []byte("p"), QoS: qos}, func(error, byte) {
				mu.Lock()
				calls[i]++
				mu.Unlock()
			})
			accepted[i] = err == nil
		}
		subscribed := make(chan struct{})
		go func() {
			defer close(subscribed)
			ctx, cancel := context.WithTimeout(context.Background(), fuzzWait)
			defer cancel()
			_, _ = c.Subscribe(ctx, []Subscription{{Filter: "down/#", QoS: 2}})
		}()
		close(ready)
		<-subscribed

		select {
		case <-c.Done():
		case <-time.After(fuzzWait):
			t.Fatalf("the connection was still up %v after the server closed it", fuzzWait)
		}
		if c.Err() == nil {
			t.Fatal("the connection ended without an error, though the server went away")
		}
		mu.Lock()
		defer mu.Unlock()
		for i := range calls {
			if accepted[i] && calls[i] != 1 {
				t.Fatalf("the done callback of an accepted QoS %d publish ran %d times", i+1, calls[i])
			}
			if !accepted[i] && calls[i] != 0 {
				t.Fatalf("the done callback of a refused QoS %d publish ran %d times", i+1, calls[i])
			}
		}
		if len(bad) > 0 {
			t.Fatalf("OnMessage got %s", strings.Join(bad, ", "))
		}
	})
}

// fuzzServe accepts one connection, reads the CONNECT and sends the first
// packet of stream. Once ready is closed (the client has queued what it
// sends, or failed to connect) it reads the client's packets for a moment,
// sends the rest, closes its side and reads until the client closes.
func fuzzServe(ln net.Listener, stream []byte, ready <-chan struct{}) {
	nc, err := ln.Accept()
	if err != nil {
		return
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(fuzzWait))
	br := bufio.NewReader(nc)
	if _, _, err := mqttwire.ReadPacket(br, 0, nil); err != nil {
		return
	}
	first, whole := fuzzFirstPacket(stream)
	if _, err := nc.Write(stream[:first]); err != nil {
		return
	}
	if whole {
		// Dial decides on a whole first packet; without one it waits
		// for more, and the rest follows at once.
		select {
		case <-ready:
		case <-time.After(fuzzWait):
		}
		_ = nc.SetReadDeadline(time.Now().Add(fuzzServerWait))
		for range 3 {
			if _, _, err := mqttwire.ReadPacket(br, 0, nil); err != nil {
				break
			}
		}
	}
	_ = nc.SetDeadline(time.Now().Add(fuzzWait))
	_, _ = nc.Write(stream[first:])
	_ = nc.(*net.TCPConn).CloseWrite()
	_, _ = io.Copy(io.Discard, br)
}

// fuzzFirstPacket returns the length of stream's first packet, and
// whether it is whole; when it is not, all of stream.
func fuzzFirstPacket(stream []byte) (n int, whole bool) {
	if len(stream) > 1 {
		if rem, size, ok := mqttwire.Varint(stream[1:]); ok && 1+size+rem <= len(stream) {
			return 1 + size + rem, true
		}
	}
	return len(stream), false
}
