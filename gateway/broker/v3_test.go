package broker

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
)

// MQTT 3.1.1 conformance, through the Eclipse Paho Go client where a real
// client's behaviour is the point, and through the raw client of
// malformed_test.go where exact bytes are.

// v3Client is a Paho client whose every received message, whatever the
// subscription, arrives on msgs: subscriptions are made without handlers,
// so Paho hands each PUBLISH to the default handler exactly once and the
// test sees what the broker sent, not what Paho's router fanned out.
type v3Client struct {
	mqtt.Client
	msgs chan mqtt.Message
	lost chan error

	mu sync.Mutex
	nc net.Conn // the socket, for tests that cut it
}

// v3Connect connects a Paho MQTT 3.1.1 client to addr; edit adjusts its
// options first. It fails the test unless the broker accepts it, and
// disconnects with the test.
func v3Connect(t *testing.T, addr, id string, edit func(*mqtt.ClientOptions)) (*v3Client, mqtt.Token) {
	t.Helper()
	vc := &v3Client{msgs: make(chan mqtt.Message, 256), lost: make(chan error, 1)}
	o := mqtt.NewClientOptions().
		AddBroker("tcp://" + addr).
		SetClientID(id).
		SetProtocolVersion(4).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(wireWait).
		SetWriteTimeout(wireWait).
		SetKeepAlive(30 * time.Second).
		SetOrderMatters(true).
		SetDefaultPublishHandler(func(_ mqtt.Client, m mqtt.Message) { vc.msgs <- m }).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { vc.lost <- err }).
		SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			nc, err := net.DialTimeout("tcp", u.Host, wireWait)
			vc.mu.Lock()
			vc.nc = nc
			vc.mu.Unlock()
			return nc, err
		})
	if edit != nil {
		edit(o)
	}
	vc.Client = mqtt.NewClient(o)
	tok := vc.Connect()
	v3Wait(t, tok, "connect "+id)
	t.Cleanup(func() {
		if vc.IsConnectionOpen() {
			vc.Disconnect(0)
		}
	})
	return vc, tok
}

// v3Wait waits a bounded time for a Paho token and fails on its error.
func v3Wait(t *testing.T, tok mqtt.Token, what string) {
	t.Helper()
	if !tok.WaitTimeout(wireWait) {
		t.Fatalf("%s: no answer within %v", what, wireWait)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// subscribe subscribes to filter and requires the broker to grant want.
func (vc *v3Client) subscribe(t *testing.T, filter string, qos, want byte) {
	t.Helper()
	tok := vc.Subscribe(filter, qos, nil)
	v3Wait(t, tok, "subscribe "+filter)
	if got := tok.(*mqtt.SubscribeToken).Result()[filter]; got != want {
		t.Fatalf("SUBACK for %q: 0x%02X, want 0x%02X", filter, got, want)
	}
}

// publish publishes and waits for the QoS flow to complete.
func (vc *v3Client) publish(t *testing.T, topic string, qos byte, retain bool, payload string) {
	t.Helper()
	v3Wait(t, vc.Publish(topic, qos, retain, payload), "publish to "+topic)
}

// expect requires the next message received to be exactly this one.
func (vc *v3Client) expect(t *testing.T, topic, payload string, qos byte, retained bool) {
	t.Helper()
	select {
	case m := <-vc.msgs:
		if m.Topic() != topic || string(m.Payload()) != payload || m.Qos() != qos || m.Retained() != retained {
			t.Fatalf("got %q %q QoS %d retain %v; want %q %q QoS %d retain %v",
				m.Topic(), m.Payload(), m.Qos(), m.Retained(), topic, payload, qos, retained)
		}
	case <-time.After(wireWait):
		t.Fatalf("no message on %q within %v", topic, wireWait)
	}
}

// cut ends the client's connection without DISCONNECT, as a network
// failure would. It shuts the socket down rather than closing it: Paho
// takes a read on a closed socket for its own disconnect and would not
// report the loss.
func (vc *v3Client) cut(t *testing.T) {
	t.Helper()
	vc.mu.Lock()
	nc, _ := vc.nc.(*net.TCPConn)
	vc.mu.Unlock()
	if nc == nil {
		t.Fatal("no TCP socket to cut")
	}
	_ = nc.CloseWrite()
	_ = nc.CloseRead()
	select {
	case <-vc.lost:
	case <-time.After(wireWait):
		t.Fatal("the client did not notice its socket closing")
	}
}

// writePasswordFile writes a password file with the given user and
// password pairs and returns its path.
func writePasswordFile(t *testing.T, pairs ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "passwd")
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := auth.SetPassword(path, pairs[i], []byte(pairs[i+1])); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// TestV3ConnackReturnCodes checks the CONNACK return codes a 3.1.1 client
// gets, byte for byte: a refused CONNECT gets session present 0
// [MQTT-3.2.2-4] and then the connection closes [MQTT-3.2.2-5].
func TestV3ConnackReturnCodes(t *testing.T) {
	passwd := writePasswordFile(t, "alice", "s3cret")
	open := startBroker(t, nil)
	locked := startBroker(t, func(o *Options) {
		o.AllowAnonymous = false
		o.PasswordFile = passwd
	})
	connectAs := func(name, user, pass string) []byte {
		flags := byte(wireClean)
		var rest [][]byte
		if user != "" {
			flags |= wireUser
			rest = append(rest, wireStr(user))
		}
		if pass != "" {
			flags |= wirePassword
			rest = append(rest, wireStr(pass))
		}
		return wireConnect(4, flags, 30, name, rest...)
	}
	for _, tc := range []struct {
		name    string
		addr    string
		connect []byte
		want    byte // return code; 0 means accepted
	}{
		// [MQTT-3.1.2-2]: a protocol level the server does not serve
		// gets 0x01, MQTT 3.1 (level 3, "MQIsdp") included.
		{"level 3 MQIsdp", open.Addr, wireFrame(wireCONNECT, wireStr("MQIsdp"), []byte{3, wireClean, 0, 30}, wireStr("v31")), 0x01},
		{"level 3 MQTT", open.Addr, wireFrame(wireCONNECT, wireStr("MQTT"), []byte{3, wireClean, 0, 30}, wireStr("v31")), 0x01},
		{"level 6", open.Addr, wireConnect(6, wireClean, 30, "v6"), 0x01},
		{"level 0", open.Addr, wireConnect(0, wireClean, 30, "v0"), 0x01},
		// [MQTT-3.1.3-8]: an empty client id needs clean session 1,
		// otherwise 0x02; with it the server assigns one [MQTT-3.1.3-6].
		{"empty client id, clean session 0", open.Addr, wireConnect(4, 0, 30, ""), 0x02},
		{"empty client id, clean session 1", open.Addr, wireConnect(4, wireClean, 30, ""), 0},
		// 3.1.1 §3.2.2.3: 0x04 bad user name or password, 0x05 not
		// authorized.
		{"anonymous where not allowed", locked.Addr, connectAs("anon", "", ""), 0x05},
		{"wrong password", locked.Addr, connectAs("c1", "alice", "guess"), 0x04},
		{"unknown user", locked.Addr, connectAs("c2", "mallory", "s3cret"), 0x04},
		{"user name without password", locked.Addr, connectAs("c3", "alice", ""), 0x04},
		{"right password", locked.Addr, connectAs("c4", "alice", "s3cret"), 0},
		{"user name where no password file is set", open.Addr, connectAs("c5", "alice", "s3cret"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := wireDial(t, tc.addr)
			w.send(tc.connect)
			w.expect([]byte{wireCONNACK, 2, 0, tc.want})
			if tc.want != 0 {
				w.expectClosed()
				return
			}
			w.send([]byte{wirePINGREQ, 0})
			w.expect([]byte{wirePINGRESP, 0})
		})
	}
	// [MQTT-3.1.2-1]: a wrong protocol name may be dropped without a
	// CONNACK, which is what the broker does.
	w := wireDial(t, open.Addr)
	w.send(wireFrame(wireCONNECT, wireStr("MQTX"), []byte{4, wireClean, 0, 30}, wireStr("x")))
	w.expectClosed()
	wireAlive(t, open.Addr)
}

// expectPublish reads a PUBLISH and requires it to be exactly the one
// wirePublish builds from these arguments with the packet identifier the
// broker chose, which it returns; for QoS 1 and 2 the identifier must not
// be 0 [MQTT-2.3.1-1].
func (w *wireConn) expectPublish(level, flags byte, topic, payload string) uint16 {
	w.t.Helper()
	h, body, err := w.read()
	if err != nil {
		w.t.Fatalf("want PUBLISH %q %q: %v", topic, payload, err)
	}
	var pid uint16
	if flags&0x06 != 0 && len(body) >= 4+len(topic) {
		pid = uint16(body[2+len(topic)])<<8 | uint16(body[3+len(topic)])
		if pid == 0 {
			w.t.Fatalf("PUBLISH % X has packet identifier 0", body)
		}
	}
	want := wirePublish(level, flags, topic, pid, payload)
	if got := wireFrame(h, body); string(got) != string(want) {
		w.t.Fatalf("got % X, want % X", got, want)
	}
	return pid
}

// wireAck builds a PUBACK, PUBREC, PUBREL or PUBCOMP (header byte h) for
// packet identifier pid, in its 3.1.1 form.
func wireAck(h byte, pid uint16) []byte { return append([]byte{h, 2}, wireU16(pid)...) }

// completeQoS2 finishes, as the receiver, the QoS 2 exchange of a PUBLISH
// received with packet identifier pid: PUBREC, the broker's PUBREL
// [MQTT-4.3.3-1], PUBCOMP.
func (w *wireConn) completeQoS2(pid uint16) {
	w.t.Helper()
	w.send(wireAck(wirePUBREC, pid))
	w.expect(wireAck(wirePUBREL, pid))
	w.send(wireAck(wirePUBCOMP, pid))
}

// TestV3SessionPresent checks the session present flag through a sequence
// of connections with one client id.
func TestV3SessionPresent(t *testing.T) {
	tb := startBroker(t, nil)
	for i, step := range []struct {
		flags   byte
		present byte
	}{
		{0, 0},         // [MQTT-3.2.2-3]: no session stored yet
		{0, 1},         // [MQTT-3.2.2-2]: the session stored by the first
		{wireClean, 0}, // [MQTT-3.2.2-1]: clean session always gets 0
		{0, 0},         // [MQTT-3.1.2-6]: the clean session discarded the old one and ended with its connection
		{0, 1},
	} {
		w := wireDial(t, tb.Addr)
		w.send(wireConnect(4, step.flags, 0, "present"))
		h, body, err := w.read()
		if err != nil || h != wireCONNACK || string(body) != string([]byte{step.present, 0}) {
			t.Fatalf("step %d: CONNACK 0x%02X % X (%v), want 20 02 %02X 00", i, h, body, err, step.present)
		}
		w.send([]byte{wireDISCONNECT, 0})
		w.expectClosed()
		v5WaitOffline(t, tb.Broker, "present")
	}
}

// TestV3CleanSession checks that a clean session keeps nothing: not its
// own subscriptions after it ends, nor the subscriptions of the session it
// replaced [MQTT-3.1.2-6].
func TestV3CleanSession(t *testing.T) {
	tb := startBroker(t, nil)
	pub, _ := v3Connect(t, tb.Addr, "clean-pub", nil)
	persistent := func(o *mqtt.ClientOptions) { o.SetCleanSession(false) }

	// A persistent session subscribes, then a clean one replaces it.
	first, _ := v3Connect(t, tb.Addr, "cleaner", persistent)
	first.subscribe(t, "clean/a", 1, 1)
	first.Disconnect(50)
	v5WaitOffline(t, tb.Broker, "cleaner")
	second, tok := v3Connect(t, tb.Addr, "cleaner", nil)
	if tok.(*mqtt.ConnectToken).SessionPresent() {
		t.Fatal("clean session: session present set") // [MQTT-3.2.2-1]
	}
	second.subscribe(t, "clean/b", 1, 1)
	second.Disconnect(50)
	v5WaitOffline(t, tb.Broker, "cleaner")

	third, tok := v3Connect(t, tb.Addr, "cleaner", persistent)
	if tok.(*mqtt.ConnectToken).SessionPresent() {
		t.Fatal("the clean session's state outlived it")
	}
	third.subscribe(t, "clean/end", 1, 1)
	pub.publish(t, "clean/a", 1, false, "to the first session")
	pub.publish(t, "clean/b", 1, false, "to the second session")
	pub.publish(t, "clean/end", 1, false, "end")
	third.expect(t, "clean/end", "end", 1, false)
}

// TestV3PersistentSession checks that a session with clean session 0
// keeps its subscriptions and the QoS 1 and 2 messages that arrive while
// its client is away, and delivers them in order on reconnect
// [MQTT-3.1.2-4] [MQTT-3.1.2-5] [MQTT-4.6.0-6].
func TestV3PersistentSession(t *testing.T) {
	tb := startBroker(t, nil)
	persistent := func(o *mqtt.ClientOptions) { o.SetCleanSession(false) }
	sub, tok := v3Connect(t, tb.Addr, "keeper", persistent)
	if tok.(*mqtt.ConnectToken).SessionPresent() {
		t.Fatal("session present on the first connection") // [MQTT-3.2.2-3]
	}
	sub.subscribe(t, "keep/#", 1, 1)
	sub.Disconnect(50)
	v5WaitOffline(t, tb.Broker, "keeper")

	pub, _ := v3Connect(t, tb.Addr, "keep-pub", nil)
	for i := range 3 {
		pub.publish(t, "keep/t", 1, false, fmt.Sprintf("m%d", i))
	}
	// QoS 2 is stored too, and delivered at the subscription's QoS 1.
	pub.publish(t, "keep/t", 2, false, "m3")

	again, tok := v3Connect(t, tb.Addr, "keeper", persistent)
	if !tok.(*mqtt.ConnectToken).SessionPresent() {
		t.Fatal("session present not set on reconnect") // [MQTT-3.2.2-2]
	}
	for i := range 4 {
		again.expect(t, "keep/t", fmt.Sprintf("m%d", i), 1, false)
	}
	// The subscription survived: live messages arrive without a new SUBSCRIBE.
	pub.publish(t, "keep/t", 1, false, "live")
	again.expect(t, "keep/t", "live", 1, false)
}

// TestV3RedeliveryOnReconnect checks that unacknowledged messages go out
// again when a persistent session reconnects, in order: a QoS 1 PUBLISH
// with DUP set and the same packet identifier, and the PUBREL of a QoS 2
// message whose PUBREC had arrived [MQTT-4.4.0-1] [MQTT-3.3.1-1].
func TestV3RedeliveryOnReconnect(t *testing.T) {
	tb := startBroker(t, nil)
	sub := wireDial(t, tb.Addr)
	sub.send(wireConnect(4, 0, 0, "redeliver"))
	sub.expect([]byte{wireCONNACK, 2, 0, 0})
	sub.send(wireSubscribe(4, 1, "rd/#", 2))
	sub.expect([]byte{wireSUBACK, 3, 0, 1, 2})

	pub := wireDial(t, tb.Addr)
	pub.connect(4, "rd-pub", 0)
	pub.send(wirePublish(4, 2, "rd/1", 1, "one"))
	pub.expect(wireAck(wirePUBACK, 1))
	pub.send(wirePublish(4, 4, "rd/2", 2, "two"))
	pub.expect(wireAck(wirePUBREC, 2))
	pub.send(wireAck(wirePUBREL, 2))
	pub.expect(wireAck(wirePUBCOMP, 2))

	p1 := sub.expectPublish(4, 2, "rd/1", "one")
	p2 := sub.expectPublish(4, 4, "rd/2", "two")
	sub.send(wireAck(wirePUBREC, p2))
	sub.expect(wireAck(wirePUBREL, p2)) // [MQTT-4.3.3-1]
	sub.nc.Close()
	v5WaitOffline(t, tb.Broker, "redeliver")

	again := wireDial(t, tb.Addr)
	again.send(wireConnect(4, 0, 0, "redeliver"))
	again.expect([]byte{wireCONNACK, 2, 1, 0})
	if got := again.expectPublish(4, 0x08|2, "rd/1", "one"); got != p1 {
		t.Fatalf("resent with packet identifier %d, want %d", got, p1)
	}
	again.expect(wireAck(wirePUBREL, p2))
	again.send(wireAck(wirePUBACK, p1), wireAck(wirePUBCOMP, p2))
	// Nothing else is outstanding: the next message is a new one.
	pub.send(wirePublish(4, 0, "rd/end", 0, "end"))
	again.expectPublish(4, 0, "rd/end", "end")
}

// TestV3QoSMatrix publishes at every QoS to subscriptions of every QoS:
// the publisher's flow completes at its QoS, and the subscriber gets the
// message once at the lower of the two [MQTT-3.8.4-6].
func TestV3QoSMatrix(t *testing.T) {
	tb := startBroker(t, nil)
	sub, _ := v3Connect(t, tb.Addr, "matrix-sub", nil)
	pub, _ := v3Connect(t, tb.Addr, "matrix-pub", nil)
	for subQoS := byte(0); subQoS <= 2; subQoS++ {
		sub.subscribe(t, fmt.Sprintf("matrix/%d/+", subQoS), subQoS, subQoS) // [MQTT-3.9.3-1]
	}
	for subQoS := byte(0); subQoS <= 2; subQoS++ {
		for pubQoS := byte(0); pubQoS <= 2; pubQoS++ {
			topic := fmt.Sprintf("matrix/%d/%d", subQoS, pubQoS)
			payload := fmt.Sprintf("sub %d pub %d", subQoS, pubQoS)
			pub.publish(t, topic, pubQoS, false, payload)
			sub.expect(t, topic, payload, min(subQoS, pubQoS), false)
		}
	}
}

// TestV3QoSFlows checks the acknowledgements of each QoS byte for byte, in
// both directions.
func TestV3QoSFlows(t *testing.T) {
	tb := startBroker(t, nil)
	sub := wireDial(t, tb.Addr)
	sub.connect(4, "flow-sub", 0)
	sub.send(wireSubscribe(4, 1, "flow/#", 2))
	sub.expect([]byte{wireSUBACK, 3, 0, 1, 2})
	pub := wireDial(t, tb.Addr)
	pub.connect(4, "flow-pub", 0)

	// QoS 0: no acknowledgement either way [MQTT-4.3.1-1].
	pub.send(wirePublish(4, 0, "flow/0", 0, "zero"))
	sub.expectPublish(4, 0, "flow/0", "zero")

	// QoS 1: PUBACK with the PUBLISH's packet identifier [MQTT-4.3.2-2]
	// [MQTT-2.3.1-6].
	pub.send(wirePublish(4, 2, "flow/1", 0x1234, "one"))
	pub.expect(wireAck(wirePUBACK, 0x1234))
	pid := sub.expectPublish(4, 2, "flow/1", "one")
	sub.send(wireAck(wirePUBACK, pid))

	// QoS 2: PUBREC, PUBREL, PUBCOMP [MQTT-4.3.3-2]; the broker sends
	// PUBREL on PUBREC [MQTT-4.3.3-1].
	pub.send(wirePublish(4, 4, "flow/2", 0xBEEF, "two"))
	pub.expect(wireAck(wirePUBREC, 0xBEEF))
	pub.send(wireAck(wirePUBREL, 0xBEEF))
	pub.expect(wireAck(wirePUBCOMP, 0xBEEF))
	sub.completeQoS2(sub.expectPublish(4, 4, "flow/2", "two"))

	// A QoS 2 PUBLISH sent again before PUBREL is acknowledged again and
	// not delivered twice [MQTT-4.3.3-2].
	pub.send(wirePublish(4, 4, "flow/2", 7, "once"))
	pub.expect(wireAck(wirePUBREC, 7))
	pub.send(wirePublish(4, 0x08|4, "flow/2", 7, "once"))
	pub.expect(wireAck(wirePUBREC, 7))
	pub.send(wireAck(wirePUBREL, 7))
	pub.expect(wireAck(wirePUBCOMP, 7))
	sub.completeQoS2(sub.expectPublish(4, 4, "flow/2", "once"))
	pub.send(wirePublish(4, 0, "flow/end", 0, "end"))
	sub.expectPublish(4, 0, "flow/end", "end")
}

// TestV3Retained checks retained messages: stored per topic and replaced
// [MQTT-3.3.1-5], sent to new subscriptions with RETAIN set
// [MQTT-3.3.1-6] [MQTT-3.3.1-8] at the lower QoS, sent live with RETAIN
// clear [MQTT-3.3.1-9], deleted by an empty retained message which is
// itself not stored [MQTT-3.3.1-10] [MQTT-3.3.1-11], and untouched by a
// message without RETAIN [MQTT-3.3.1-12].
func TestV3Retained(t *testing.T) {
	tb := startBroker(t, nil)
	pub, _ := v3Connect(t, tb.Addr, "ret-pub", nil)
	pub.publish(t, "ret/a", 1, true, "first")
	pub.publish(t, "ret/a", 2, true, "second")
	pub.publish(t, "ret/a", 1, false, "not retained")
	pub.publish(t, "ret/b", 0, true, "b0")
	pub.publish(t, "ret/c", 1, true, "doomed")
	pub.publish(t, "ret/c", 1, true, "")
	// QoS 0 with RETAIN replaces as well [MQTT-3.3.1-7].
	pub.publish(t, "ret/d", 1, true, "d1")
	pub.publish(t, "ret/d", 0, true, "d0")
	// A QoS 0 PUBLISH has no acknowledgement: a QoS 1 one behind it on the
	// same connection, once acknowledged, shows the broker has handled it.
	pub.publish(t, "ret-sync", 1, false, "sync")

	sub, _ := v3Connect(t, tb.Addr, "ret-sub", nil)
	sub.subscribe(t, "ret/#", 1, 1)
	got := map[string]mqtt.Message{}
	for range 3 {
		select {
		case m := <-sub.msgs:
			got[m.Topic()] = m
		case <-time.After(wireWait):
			t.Fatalf("retained messages: got %d of 3", len(got))
		}
	}
	for topic, want := range map[string]struct {
		payload string
		qos     byte
	}{
		"ret/a": {"second", 1},
		"ret/b": {"b0", 0},
		"ret/d": {"d0", 0},
	} {
		m := got[topic]
		if m == nil || string(m.Payload()) != want.payload || m.Qos() != want.qos || !m.Retained() {
			t.Errorf("%s: got %v, want %q QoS %d retained", topic, m, want.payload, want.qos)
		}
	}

	// Live: RETAIN cleared.
	pub.publish(t, "ret/a", 1, true, "third")
	sub.expect(t, "ret/a", "third", 1, false)

	// Subscribing again replaces the subscription and sends the retained
	// messages again [MQTT-3.8.4-3].
	sub2, _ := v3Connect(t, tb.Addr, "ret-sub2", nil)
	sub2.subscribe(t, "ret/a", 2, 2)
	sub2.expect(t, "ret/a", "third", 1, true)
	sub2.subscribe(t, "ret/a", 2, 2)
	sub2.expect(t, "ret/a", "third", 1, true)

	// Nothing more is on its way to the first subscriber.
	pub.publish(t, "ret/end", 0, false, "end")
	sub.expect(t, "ret/end", "end", 0, false)
}

// TestV3OverlappingSubscriptions checks that a client whose subscriptions
// overlap gets each message once, at the highest QoS they grant
// [MQTT-3.3.5-1].
func TestV3OverlappingSubscriptions(t *testing.T) {
	tb := startBroker(t, nil)
	sub, _ := v3Connect(t, tb.Addr, "overlap-sub", nil)
	sub.subscribe(t, "ov/#", 0, 0)
	sub.subscribe(t, "ov/+/x", 2, 2)
	sub.subscribe(t, "ov/a/x", 1, 1)
	sub.subscribe(t, "+/a/#", 0, 0)
	pub, _ := v3Connect(t, tb.Addr, "overlap-pub", nil)
	for _, m := range []struct {
		topic   string
		pubQoS  byte
		wantQoS byte
	}{
		{"ov/a/x", 2, 2},
		{"ov/a/x", 1, 1},
		{"ov/a/x", 0, 0},
		{"ov/a/y", 2, 0},
		{"ov/b/x", 2, 2},
	} {
		payload := fmt.Sprintf("%s at %d", m.topic, m.pubQoS)
		pub.publish(t, m.topic, m.pubQoS, false, payload)
		sub.expect(t, m.topic, payload, m.wantQoS, false)
	}
	pub.publish(t, "ov/end", 0, false, "end")
	sub.expect(t, "ov/end", "end", 0, false)
}

// TestV3Will checks the will: published when the connection ends without
// DISCONNECT [MQTT-3.1.2-8], at its QoS and retained when asked
// [MQTT-3.1.2-17], and discarded on DISCONNECT [MQTT-3.1.2-10].
func TestV3Will(t *testing.T) {
	tb := startBroker(t, nil)
	watch, _ := v3Connect(t, tb.Addr, "will-watch", nil)
	watch.subscribe(t, "will/#", 2, 2)

	cut, _ := v3Connect(t, tb.Addr, "will-cut", func(o *mqtt.ClientOptions) { o.SetWill("will/cut", "cut off", 1, false) })
	cut.cut(t)
	watch.expect(t, "will/cut", "cut off", 1, false)

	polite, _ := v3Connect(t, tb.Addr, "will-polite", func(o *mqtt.ClientOptions) { o.SetWill("will/polite", "must not appear", 2, false) })
	polite.Disconnect(50)
	v5WaitOffline(t, tb.Broker, "will-polite")
	pub, _ := v3Connect(t, tb.Addr, "will-pub", nil)
	pub.publish(t, "will/polite", 0, false, "sentinel")
	watch.expect(t, "will/polite", "sentinel", 0, false)

	kept, _ := v3Connect(t, tb.Addr, "will-kept", func(o *mqtt.ClientOptions) { o.SetWill("will/kept", "last words", 2, true) })
	kept.cut(t)
	watch.expect(t, "will/kept", "last words", 2, false) // live: RETAIN cleared [MQTT-3.3.1-9]
	late, _ := v3Connect(t, tb.Addr, "will-late", nil)
	late.subscribe(t, "will/kept", 2, 2)
	late.expect(t, "will/kept", "last words", 2, true)
}

// TestV3KeepAlive checks that a client that keeps sending within its keep
// alive stays connected, and that one that stops is disconnected after one
// and a half keep alive periods, as a network failure: its will goes out
// [MQTT-3.1.2-24].
func TestV3KeepAlive(t *testing.T) {
	tb := startBroker(t, nil)
	watch := wireDial(t, tb.Addr)
	watch.connect(4, "ka-watch", 0)
	watch.send(wireSubscribe(4, 1, "ka/#", 0))
	watch.expect([]byte{wireSUBACK, 3, 0, 1, 0})

	w := wireDial(t, tb.Addr)
	w.send(wireConnect(4, wireClean|wireWill, 1, "ka", wireStr("ka/will"), wireStr("timed out")))
	w.expect([]byte{wireCONNACK, 2, 0, 0})
	// 2 s of PINGREQ every 0.5 s: longer than 1.5 s in all, never that
	// long between packets.
	for range 4 {
		time.Sleep(500 * time.Millisecond)
		w.send([]byte{wirePINGREQ, 0})
		w.expect([]byte{wirePINGRESP, 0})
	}
	quiet := time.Now()
	w.expectClosed()
	if d := time.Since(quiet); d < 1250*time.Millisecond || d > 2500*time.Millisecond {
		t.Fatalf("closed %v after the last packet, want 1.5 s", d.Round(time.Millisecond))
	}
	watch.expectPublish(4, 0, "ka/will", "timed out")
}

// TestV3SessionTakeover checks that a second connection with a client id
// in use closes the first [MQTT-3.1.4-2], which in 3.1.1 hears nothing
// first, and that the persistent session carries over to the new one.
func TestV3SessionTakeover(t *testing.T) {
	tb := startBroker(t, nil)
	first := wireDial(t, tb.Addr)
	first.send(wireConnect(4, 0, 0, "twin"))
	first.expect([]byte{wireCONNACK, 2, 0, 0})
	first.send(wireSubscribe(4, 1, "twin/#", 1))
	first.expect([]byte{wireSUBACK, 3, 0, 1, 1})

	second := wireDial(t, tb.Addr)
	second.send(wireConnect(4, 0, 0, "twin"))
	second.expect([]byte{wireCONNACK, 2, 1, 0})
	first.expectClosed()

	pub := wireDial(t, tb.Addr)
	pub.connect(4, "twin-pub", 0)
	pub.send(wirePublish(4, 0, "twin/x", 0, "to the new one"))
	second.expectPublish(4, 0, "twin/x", "to the new one")

	// With clean session the taken-over session is discarded.
	third := wireDial(t, tb.Addr)
	third.send(wireConnect(4, wireClean, 0, "twin"))
	third.expect([]byte{wireCONNACK, 2, 0, 0})
	second.expectClosed()
	third.send([]byte{wirePINGREQ, 0})
	third.expect([]byte{wirePINGRESP, 0})
}

// TestV3SubackDenied checks that a filter the ACL refuses gets 0x80 in
// its place in SUBACK, the others their granted QoS in order
// [MQTT-3.8.4-5] [MQTT-3.9.3-1] (3.1.1 §3.9.3), and that a granted "#",
// which also matches topics its user may not read, delivers only those it
// may.
func TestV3SubackDenied(t *testing.T) {
	tb := startBroker(t, func(o *Options) {
		o.ACL = []auth.ACLRule{
			{User: "*", Topic: "open/#", Access: "readwrite"},
			{User: "*", Topic: "secret/#", Access: "write"},
		}
	})
	sub := wireDial(t, tb.Addr)
	sub.connect(4, "acl-sub", 0)
	sub.send(wireFrame(wireSUBSCRIBE, wireU16(3),
		wireStr("open/a"), []byte{1},
		wireStr("secret/x"), []byte{1},
		wireStr("open/#"), []byte{2},
		wireStr("#"), []byte{0}))
	sub.expect([]byte{wireSUBACK, 6, 0, 3, 1, 0x80, 2, 0})

	pub := wireDial(t, tb.Addr)
	pub.connect(4, "acl-pub", 0)
	pub.send(wirePublish(4, 0, "secret/x", 0, "hidden"))
	pub.send(wirePublish(4, 0, "open/a", 0, "visible"))
	sub.expectPublish(4, 0, "open/a", "visible")
}

// TestV3Unsubscribe checks UNSUBACK, for a filter subscribed and for one
// that was not [MQTT-3.10.4-4] [MQTT-3.10.4-5], and that an unsubscribed
// filter delivers nothing more [MQTT-3.10.4-1] [MQTT-3.10.4-2].
func TestV3Unsubscribe(t *testing.T) {
	tb := startBroker(t, nil)
	sub := wireDial(t, tb.Addr)
	sub.connect(4, "unsub", 0)
	sub.send(wireFrame(wireSUBSCRIBE, wireU16(1), wireStr("un/a"), []byte{0}, wireStr("un/b"), []byte{0}))
	sub.expect([]byte{wireSUBACK, 4, 0, 1, 0, 0})
	pub := wireDial(t, tb.Addr)
	pub.connect(4, "unsub-pub", 0)
	pub.send(wirePublish(4, 0, "un/a", 0, "before"))
	sub.expectPublish(4, 0, "un/a", "before")

	sub.send(wireFrame(wireUNSUBSCRIBE, wireU16(2), wireStr("un/a")))
	sub.expect([]byte{wireUNSUBACK, 2, 0, 2})
	sub.send(wireFrame(wireUNSUBSCRIBE, wireU16(3), wireStr("un/never"), wireStr("un/+")))
	sub.expect([]byte{wireUNSUBACK, 2, 0, 3})

	pub.send(wirePublish(4, 0, "un/a", 0, "after"))
	pub.send(wirePublish(4, 0, "un/b", 0, "still"))
	sub.expectPublish(4, 0, "un/b", "still")
}
