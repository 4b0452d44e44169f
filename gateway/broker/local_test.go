package broker

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

func localConnect(t *testing.T, b *Broker, id string) *Client {
	t.Helper()
	cl, err := b.Connect(id)
	if err != nil {
		t.Fatalf("Connect(%q): %v", id, err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// recvWithin returns the next message on ch, failing the test if none
// comes within d on the suite's time scale.
func recvWithin(t *testing.T, ch <-chan Message, d time.Duration) Message {
	t.Helper()
	d = testkit.Scale(d)
	select {
	case m := <-ch:
		return m
	case <-time.After(d):
		t.Fatalf("no message within %s", d)
		return Message{}
	}
}

func TestLocalClientBothWays(t *testing.T) {
	tb := startBroker(t, nil)
	local := localConnect(t, tb.Broker, "sensors")
	got := make(chan Message, 4)
	if err := local.Subscribe("relay/+/set", 1, func(m Message) { got <- m }); err != nil {
		t.Fatal(err)
	}

	net1, netGot := lsConnect(t, mustDial(t, "tcp", tb.Addr), "dashboard", "")
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	if _, err := net1.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "readings/#", QoS: 1}}}); err != nil {
		t.Fatal(err)
	}

	// Network → in-process.
	if _, err := net1.Publish(ctx, &paho.Publish{Topic: "relay/pump/set", QoS: 1, Payload: []byte("ON")}); err != nil {
		t.Fatal(err)
	}
	m := recvWithin(t, got, 5*time.Second)
	if m.Topic != "relay/pump/set" || string(m.Payload) != "ON" || m.QoS != 1 {
		t.Fatalf("in-process client got %+v", m)
	}

	// In-process → network.
	if err := local.Publish(ctx, "readings/t1", []byte("21.5"), 1, false); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-netGot:
		if s != "readings/t1 21.5" {
			t.Fatalf("network client got %q", s)
		}
	case <-time.After(testkit.Scale(5 * time.Second)):
		t.Fatal("network client got nothing")
	}
}

func TestLocalClientRetainedAndOverlap(t *testing.T) {
	tb := startBroker(t, nil)
	pub := localConnect(t, tb.Broker, "pub")
	ctx := context.Background()
	if err := pub.Publish(ctx, "state/door", []byte("open"), 1, true); err != nil {
		t.Fatal(err)
	}
	sub := localConnect(t, tb.Broker, "sub")
	a, b := make(chan Message, 4), make(chan Message, 4)
	if err := sub.Subscribe("state/#", 1, func(m Message) { a <- m }); err != nil {
		t.Fatal(err)
	}
	if m := recvWithin(t, a, 5*time.Second); !m.Retain || string(m.Payload) != "open" {
		t.Fatalf("retained on subscribe: %+v, want retain flag and payload open", m)
	}
	if err := sub.Subscribe("state/door", 0, func(m Message) { b <- m }); err != nil {
		t.Fatal(err)
	}
	recvWithin(t, b, 5*time.Second) // its own retained copy
	if err := pub.Publish(ctx, "state/door", []byte("closed"), 1, false); err != nil {
		t.Fatal(err)
	}
	// One delivery reaches both handlers, at the highest QoS.
	ma, mb := recvWithin(t, a, 5*time.Second), recvWithin(t, b, 5*time.Second)
	if string(ma.Payload) != "closed" || string(mb.Payload) != "closed" || ma.QoS != 1 {
		t.Fatalf("overlap: %+v %+v", ma, mb)
	}
	select {
	case m := <-a:
		t.Fatalf("duplicate delivery %+v", m)
	case <-time.After(100 * time.Millisecond):
	}

	sub.Unsubscribe("state/#")
	if err := pub.Publish(ctx, "state/door", []byte("ajar"), 0, false); err != nil {
		t.Fatal(err)
	}
	recvWithin(t, b, 5*time.Second)
	select {
	case m := <-a:
		t.Fatalf("delivered after unsubscribe: %+v", m)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestLocalClientErrors(t *testing.T) {
	tb := startBroker(t, nil)
	cl := localConnect(t, tb.Broker, "x")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"wildcard topic", cl.Publish(ctx, "a/+", nil, 0, false)},
		{"qos 3", cl.Publish(ctx, "a", nil, 3, false)},
		{"bad filter", cl.Subscribe("a/#/b", 0, func(Message) {})},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := cl.Publish(cctx, "a", nil, 0, false); err == nil {
		t.Error("publish with a cancelled context: no error")
	}
	if _, err := tb.Broker.Connect(""); err == nil {
		t.Error("Connect with an empty id: no error")
	}
}

// TestSlowLocalHandlerDoesNotStallPublisher: a handler that blocks costs
// only its own budget; the publisher and other subscribers go on, and the
// QoS 0 messages past the budget are counted as dropped.
func TestSlowLocalHandlerDoesNotStallPublisher(t *testing.T) {
	tb := startBroker(t, func(o *Options) { o.MaxQueuedBytes = 64 << 10; o.MaxPacketSize = 16 << 10 })
	release := make(chan struct{})
	slow := localConnect(t, tb.Broker, "slow")
	if err := slow.Subscribe("load/#", 0, func(Message) { <-release }); err != nil {
		t.Fatal(err)
	}
	defer close(release)
	fast := localConnect(t, tb.Broker, "fast")
	var mu sync.Mutex
	n := 0
	done := make(chan struct{})
	const total = 2000
	if err := fast.Subscribe("load/#", 0, func(Message) {
		mu.Lock()
		n++
		if n == total {
			close(done)
		}
		mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	pub := localConnect(t, tb.Broker, "pub")
	payload := bytes.Repeat([]byte("x"), 1024)
	// Publish in rounds that fit the fast subscriber's own budget and wait
	// for each: if the blocked handler held up routing, a round would
	// never arrive.
	for i := 0; i < total; i++ {
		if err := pub.Publish(context.Background(), "load/x", payload, 0, false); err != nil {
			t.Fatal(err)
		}
		if i%16 == 15 { // 16 messages of 1 KiB cost 37 KB of the 64 KiB budget
			waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return n == i+1 }, "fast subscriber keeps up")
		}
	}
	select {
	case <-done:
	case <-time.After(testkit.Scale(10 * time.Second)):
		mu.Lock()
		t.Fatalf("fast subscriber got %d of %d while a slow one blocked", n, total)
	}
	// 2,000 KiB against a 64 KiB budget: most went nowhere for the slow one.
	if d := tb.Broker.stats.dropped.Load(); d < total/2 {
		t.Fatalf("dropped = %d, want most of %d counted for the blocked handler", d, total)
	}
}

// stalledClient connects over raw TCP, subscribes to filter at qos and
// then never reads again nor acknowledges anything.
func stalledClient(t *testing.T, addr, id, filter string, qos byte) net.Conn {
	t.Helper()
	c := mustDial(t, "tcp", addr)
	t.Cleanup(func() { c.Close() })
	var buf bytes.Buffer
	cp := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 4}
	cp.Connect = packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: id, Clean: true, Keepalive: 0}
	_ = cp.ConnectEncode(&buf)
	sp := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 4, PacketID: 1,
		Filters: packets.Subscriptions{{Filter: filter, Qos: qos}}}
	_ = sp.SubscribeEncode(&buf)
	if _, err := c.Write(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	// Read CONNACK and SUBACK only.
	_ = c.SetReadDeadline(time.Now().Add(testkit.Scale(5 * time.Second)))
	b := make([]byte, 9)
	if _, err := readFull(c, b); err != nil || b[0] != 0x20 || b[3] != 0 || b[4] != 0x90 {
		t.Fatalf("CONNACK/SUBACK: % x, %v", b, err)
	}
	return c
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestStalledNetworkSubscriber: a subscriber that stops reading never
// holds up the publisher or a healthy subscriber; its QoS 0 messages past
// its byte budget are dropped.
func TestStalledNetworkSubscriber(t *testing.T) {
	tb := startBroker(t, func(o *Options) { o.MaxQueuedBytes = 64 << 10; o.MaxPacketSize = 16 << 10 })
	stalledClient(t, tb.Addr, "stalled", "load/#", 0)
	healthy := localConnect(t, tb.Broker, "healthy")
	const total = 5000
	got := make(chan struct{}, total)
	if err := healthy.Subscribe("load/#", 0, func(Message) { got <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	pub := localConnect(t, tb.Broker, "pub")
	payload := bytes.Repeat([]byte("y"), 4096)
	deadline := time.After(testkit.Scale(20 * time.Second))
	for i := 0; i < total; i++ {
		if err := pub.Publish(context.Background(), fmt.Sprintf("load/%d", i%10), payload, 0, false); err != nil {
			t.Fatal(err)
		}
		// Rounds within the healthy subscriber's budget, each awaited:
		// a delivered round holds its bytes until its handlers have run,
		// so two rounds must fit the 64 KiB budget: 4 messages of 4 KiB,
		// each counted twice plus 256 bytes, are 34 KB.
		if i%2 == 1 {
			for j := 0; j < 2; j++ {
				select {
				case <-got:
				case <-deadline:
					t.Fatalf("healthy subscriber got fewer than %d of %d", i, total)
				}
			}
		}
	}
	if d := tb.Broker.stats.dropped.Load(); d == 0 {
		t.Fatal("no drops counted for a subscriber that never reads 20 MB")
	}
}

// TestStalledWindowDisconnected: a client that takes QoS 1 messages and
// never acknowledges them is disconnected after the inflight timeout.
func TestStalledWindowDisconnected(t *testing.T) {
	tb := startBroker(t, func(o *Options) { o.InflightTimeout = time.Second })
	c := stalledClient(t, tb.Addr, "no-acks", "q/#", 1)
	pub := localConnect(t, tb.Broker, "pub")
	if err := pub.Publish(context.Background(), "q/1", []byte("ack me"), 1, false); err != nil {
		t.Fatal(err)
	}
	// Read until the broker closes the connection.
	_ = c.SetReadDeadline(time.Now().Add(testkit.Scale(10 * time.Second)))
	buf := make([]byte, 4096)
	start := time.Now()
	for {
		if _, err := c.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("stalled client still connected after %v", testkit.Scale(10*time.Second))
			}
			break
		}
	}
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("disconnected after %s, before the 1s inflight timeout", el)
	}
}

// TestSubscriptionLimit: past max_subscriptions a new filter is refused
// with 0x97 while replacing an existing one still works.
func TestSubscriptionLimit(t *testing.T) {
	tb := startBroker(t, func(o *Options) { o.MaxSubscriptions = 3 })
	cl, _ := lsConnect(t, mustDial(t, "tcp", tb.Addr), "many", "")
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	var subs []paho.SubscribeOptions
	for i := 0; i < 4; i++ {
		subs = append(subs, paho.SubscribeOptions{Topic: fmt.Sprintf("f/%d", i), QoS: 0})
	}
	subs = append(subs, paho.SubscribeOptions{Topic: "f/0", QoS: 1})
	sa, err := cl.Subscribe(ctx, &paho.Subscribe{Subscriptions: subs})
	if sa == nil {
		t.Fatalf("no SUBACK: %v", err)
	}
	want := []byte{0, 0, 0, rcQuotaExceeded, 1}
	if !bytes.Equal(sa.Reasons, want) {
		t.Fatalf("SUBACK reasons % x, want % x", sa.Reasons, want)
	}
}

// waitFor polls cond for up to 10 s on the suite's time scale.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, what, cond)
}

// TestLocalClientIDReserved: a network client cannot take over the
// session of one of the gateway's own clients.
func TestLocalClientIDReserved(t *testing.T) {
	tb := startBroker(t, nil)
	localConnect(t, tb.Broker, "fieldgate-sensors")
	cl := paho.NewClient(paho.ClientConfig{Conn: mustDial(t, "tcp", tb.Addr)})
	ctx, cancel := context.WithTimeout(context.Background(), testkit.Scale(5*time.Second))
	defer cancel()
	ca, err := cl.Connect(ctx, &paho.Connect{ClientID: "fieldgate-sensors", KeepAlive: 30, CleanStart: true})
	if ca == nil || ca.ReasonCode != rcClientIDInvalid {
		t.Fatalf("CONNACK %+v, %v; want reason 0x85", ca, err)
	}
}

// TestRedeliveryWithinSmallerReceiveMaximum: a client that returns with a
// smaller receive maximum gets its unacknowledged messages again only as
// its window allows, each with its original identifier [MQTT-4.9.0-1]
// [MQTT-4.4.0-1].
func TestRedeliveryWithinSmallerReceiveMaximum(t *testing.T) {
	tb := startBroker(t, nil)
	window := func(n uint16) func(*packets.Packet) {
		return func(pk *packets.Packet) {
			v5SetExpiry(pk, 60)
			pk.Properties.ReceiveMaximum = n
		}
	}
	c, _ := connectRaw(t, tb.Addr, 5, "shrink", true, window(3))
	c.subscribe(1, packets.Subscription{Filter: "sh/#", Qos: 1})
	p, _ := connectRaw(t, tb.Addr, 5, "shrink-pub", true, nil)
	for i := range 3 {
		p.publish(rawPublish("sh/t", fmt.Sprint(i), 1, false, uint16(i+1)))
	}
	var sent []*packets.Packet
	for i := range 3 {
		sent = append(sent, c.expectPublish("sh/t", fmt.Sprint(i), 1))
	}
	c.close()
	v5WaitOffline(t, tb.Broker, "shrink")

	c, _ = connectRaw(t, tb.Addr, 5, "shrink", false, window(1))
	for i, was := range sent {
		m := c.expectPublish("sh/t", fmt.Sprint(i), 1)
		if m.PacketID != was.PacketID || !m.FixedHeader.Dup {
			t.Fatalf("resend %d: got %s, want id %d with DUP", i, rawDescribe(m), was.PacketID)
		}
		c.quiet() // one at a time: the window is 1
		c.send(rawAck(packets.Puback, m.PacketID, 0))
	}
	c.quiet()
}

// TestLocalClientCloseFromHandler: closing a client from its own handler
// returns, and the session ends once the handler has.
func TestLocalClientCloseFromHandler(t *testing.T) {
	tb := startBroker(t, nil)
	cl, err := tb.Broker.Connect("self-closing")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	if err := cl.Subscribe("bye", 1, func(Message) { cl.Close(); close(closed) }); err != nil {
		t.Fatal(err)
	}
	pub := localConnect(t, tb.Broker, "pub")
	if err := pub.Publish(context.Background(), "bye", []byte("now"), 1, false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(testkit.Scale(5 * time.Second)):
		t.Fatal("Close from a handler did not return")
	}
	waitFor(t, func() bool {
		tb.Broker.mu.Lock()
		defer tb.Broker.mu.Unlock()
		return tb.Broker.sessions["self-closing"] == nil
	}, "the session ends after its handler returns")
}

func TestStatsAndClients(t *testing.T) {
	tb := startBroker(t, nil)
	b := tb.Broker
	c, _ := connectRaw(t, tb.Addr, 5, "stats-client", true, nil)
	defer c.close()
	deadline := time.Now().Add(testkit.Scale(5 * time.Second))
	for len(b.Clients()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cs := b.Clients()
	if len(cs) != 1 || cs[0].ID != "stats-client" || cs[0].Remote == "" {
		t.Fatalf("Clients() = %+v, want the one raw client", cs)
	}
	st := b.Stats()
	if st.Connected < 1 || st.Connections < 1 || st.Started.IsZero() {
		t.Errorf("Stats() = %+v", st)
	}
}
