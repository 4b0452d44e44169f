package broker

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// MQTT 5.0 conformance: CONNECT and CONNACK, sessions, keep alive,
// takeover, shutdown and $SYS here; PUBLISH flows in v5_publish_test.go,
// subscriptions and retained messages in v5_subscribe_test.go, wills in
// v5_will_test.go. Each check names the normative statement it covers, or
// the section where the statement has no number. Tests use Paho
// (paho.golang) where a real client's behaviour is the point, and
// rawClient where the exact packets are.

// v5Client is a Paho MQTT 5 client on its own socket; every PUBLISH it
// receives arrives on msgs, a server DISCONNECT on gone.
type v5Client struct {
	*paho.Client
	t    testing.TB
	msgs chan *paho.Publish
	gone chan *paho.Disconnect
	stop chan struct{}
}

// v5Connect connects a Paho client to addr with cp. It fails the test
// unless the broker accepts it, and disconnects with the test.
func v5Connect(t testing.TB, addr string, cp *paho.Connect) (*v5Client, *paho.Connack) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, rawWait)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c := &v5Client{
		t:    t,
		msgs: make(chan *paho.Publish, 1024),
		gone: make(chan *paho.Disconnect, 1),
		stop: make(chan struct{}),
	}
	c.Client = paho.NewClient(paho.ClientConfig{
		Conn: nc,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				select {
				case c.msgs <- pr.Packet:
				case <-c.stop:
				}
				return true, nil
			},
		},
		OnServerDisconnect: func(d *paho.Disconnect) {
			select {
			case c.gone <- d:
			default:
			}
		},
		PacketTimeout: rawWait,
	})
	ctx, cancel := context.WithTimeout(context.Background(), rawWait)
	defer cancel()
	ack, err := c.Connect(ctx, cp)
	if err != nil {
		nc.Close()
		t.Fatalf("paho connect %q: %v", cp.ClientID, err)
	}
	t.Cleanup(func() {
		close(c.stop)
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	})
	return c, ack
}

// subscribe subscribes and returns the SUBACK's reason codes.
func (c *v5Client) subscribe(s *paho.Subscribe) []byte {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rawWait)
	defer cancel()
	ack, err := c.Subscribe(ctx, s)
	if err != nil {
		c.t.Fatalf("paho subscribe: %v", err)
	}
	return ack.Reasons
}

// publish publishes and fails the test unless the broker accepts it.
func (c *v5Client) publish(p *paho.Publish) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), rawWait)
	defer cancel()
	resp, err := c.Publish(ctx, p)
	if err != nil {
		c.t.Fatalf("paho publish to %q: %v", p.Topic, err)
	}
	if resp.ReasonCode != 0 {
		c.t.Fatalf("paho publish to %q: reason 0x%02X", p.Topic, resp.ReasonCode)
	}
}

// next returns the next message received, failing the test if none comes.
func (c *v5Client) next() *paho.Publish {
	c.t.Helper()
	select {
	case m := <-c.msgs:
		return m
	case <-time.After(rawWait):
		c.t.Fatalf("paho client %q: no message within %v", c.ClientID(), rawWait)
		return nil
	}
}

// expectNone fails the test if a message arrives within wait.
func (c *v5Client) expectNone(wait time.Duration) {
	c.t.Helper()
	select {
	case m := <-c.msgs:
		c.t.Fatalf("paho client %q: got %q %q, want nothing", c.ClientID(), m.Topic, m.Payload)
	case <-time.After(wait):
	}
}

// v5SetExpiry sets a CONNECT's session expiry interval in seconds.
func v5SetExpiry(pk *packets.Packet, seconds uint32) {
	pk.Properties.SessionExpiryInterval = seconds
	pk.Properties.SessionExpiryIntervalFlag = true
}

// v5Expiry is a connectRaw edit that sets the session expiry interval.
func v5Expiry(seconds uint32) func(*packets.Packet) {
	return func(pk *packets.Packet) { v5SetExpiry(pk, seconds) }
}

// v5WaitOffline waits until the broker has detached every connection of
// clientID, so that a test reconnecting next resumes the session rather
// than taking over a connection the broker has not finished closing.
func v5WaitOffline(t testing.TB, b *Broker, clientID string) {
	t.Helper()
	deadline := time.Now().Add(rawWait)
	for {
		b.mu.Lock()
		s := b.sessions[clientID]
		online := false
		if s != nil {
			s.mu.Lock()
			online = s.conn != nil
			s.mu.Unlock()
		}
		b.mu.Unlock()
		if !online {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("client %q still attached after %v", clientID, rawWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestV5ConnackProperties(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) {
		o.ReceiveMaximum = 10
		o.MaxPacketSize = 4096
		o.TopicAliasMax = 5
		o.MaxKeepalive = time.Minute
	})
	c := dialRaw(t, tb.Addr, 5)
	pk := c.connectPacket("props", true)
	pk.Connect.Keepalive = 30
	ack := c.connect(pk)
	if ack.ReasonCode != 0 || ack.SessionPresent {
		t.Fatalf("got %s, want success without a session [MQTT-3.1.4-5] [MQTT-3.2.2-2]", rawDescribe(ack))
	}
	p := &ack.Properties
	if p.ReceiveMaximum != 10 {
		t.Errorf("receive maximum %d, want the broker's 10 (§3.2.2.3.3)", p.ReceiveMaximum)
	}
	if p.MaximumPacketSize != 4096 {
		t.Errorf("maximum packet size %d, want the broker's 4096 (§3.2.2.3.6)", p.MaximumPacketSize)
	}
	if p.TopicAliasMaximum != 5 {
		t.Errorf("topic alias maximum %d, want the broker's 5 (§3.2.2.3.8)", p.TopicAliasMaximum)
	}
	if p.SessionExpiryIntervalFlag {
		t.Errorf("session expiry %d echoed though the broker used the client's (§3.2.2.3.2)", p.SessionExpiryInterval)
	}
	if p.ServerKeepAliveFlag {
		t.Errorf("server keep alive %d sent though the client's 30 s is allowed [MQTT-3.2.2-22]", p.ServerKeepAlive)
	}
	if p.AssignedClientID != "" {
		t.Errorf("assigned client id %q for a client that named itself", p.AssignedClientID)
	}
	c.ping()
}

func TestV5SessionExpiry(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.MaxSessionExpiry = time.Hour })
	pub, _ := connectRaw(t, tb.Addr, 5, "se-pub", true, nil)
	var pid uint16
	publish := func(topic, payload string) {
		pid++
		pub.publish(rawPublish(topic, payload, 1, false, pid))
	}

	t.Run("zero ends the session with the connection", func(t *testing.T) {
		c, _ := connectRaw(t, tb.Addr, 5, "se-zero", true, nil)
		c.subscribe(1, packets.Subscription{Filter: "se/zero", Qos: 1})
		c.disconnect(0)
		c2, ack := connectRaw(t, tb.Addr, 5, "se-zero", false, nil)
		if ack.SessionPresent {
			t.Errorf("session present after an expiry interval of 0 [MQTT-3.2.2-3]")
		}
		publish("se/zero", "lost")
		c2.quiet()
	})

	t.Run("positive keeps the session", func(t *testing.T) {
		c, _ := connectRaw(t, tb.Addr, 5, "se-keep", true, v5Expiry(60))
		c.subscribe(1, packets.Subscription{Filter: "se/keep", Qos: 1})
		c.disconnect(0)
		v5WaitOffline(t, tb.Broker, "se-keep")
		publish("se/keep", "kept") // while the client is away [MQTT-3.1.2-23]
		c2, ack := connectRaw(t, tb.Addr, 5, "se-keep", false, v5Expiry(60))
		if !ack.SessionPresent {
			t.Fatalf("no session present after reconnecting within the expiry [MQTT-3.2.2-3] [MQTT-3.1.2-5]")
		}
		m := c2.expectPublish("se/keep", "kept", 1)
		c2.ackPublish(m)
	})

	t.Run("passed expiry ends the session", func(t *testing.T) {
		c, _ := connectRaw(t, tb.Addr, 5, "se-short", true, v5Expiry(1))
		c.subscribe(1, packets.Subscription{Filter: "se/short", Qos: 1})
		c.disconnect(0)
		v5WaitOffline(t, tb.Broker, "se-short") // the interval counts from here
		time.Sleep(1100 * time.Millisecond)     // the spec's timing is the point
		c2, ack := connectRaw(t, tb.Addr, 5, "se-short", false, v5Expiry(1))
		if ack.SessionPresent {
			t.Errorf("session present after its expiry interval passed [MQTT-4.1.0-2]")
		}
		publish("se/short", "lost")
		c2.quiet()
	})
}

func TestV5SessionExpiryCapped(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.MaxSessionExpiry = time.Second })

	// The broker's interval replaces a longer one, and CONNACK says so
	// (§3.2.2.3.2); a shorter one is used as asked, without echo.
	for _, tc := range []struct {
		ask      uint32
		echo     bool
		expected uint32
	}{
		{ask: 3600, echo: true, expected: 1},
		{ask: 0xFFFFFFFF, echo: true, expected: 1}, // "never expires"
		{ask: 1, echo: false},
		{ask: 0, echo: false},
	} {
		c, ack := connectRaw(t, tb.Addr, 5, "cap", true, v5Expiry(tc.ask))
		p := &ack.Properties
		if p.SessionExpiryIntervalFlag != tc.echo || (tc.echo && p.SessionExpiryInterval != tc.expected) {
			t.Errorf("asked %d: CONNACK session expiry present=%t value %d, want present=%t value %d",
				tc.ask, p.SessionExpiryIntervalFlag, p.SessionExpiryInterval, tc.echo, tc.expected)
		}
		c.disconnect(0)
	}

	// The cap is what the broker applies: the session is gone after it.
	c, _ := connectRaw(t, tb.Addr, 5, "cap", true, v5Expiry(3600))
	c.subscribe(1, packets.Subscription{Filter: "cap/t", Qos: 1})
	c.disconnect(0)
	v5WaitOffline(t, tb.Broker, "cap")
	time.Sleep(1100 * time.Millisecond)
	_, ack := connectRaw(t, tb.Addr, 5, "cap", false, v5Expiry(3600))
	if ack.SessionPresent {
		t.Errorf("session outlived the broker's maximum session expiry [MQTT-4.1.0-2]")
	}
}

func TestV5CleanStart(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	pub, _ := connectRaw(t, tb.Addr, 5, "cs-pub", true, nil)

	c, ack := connectRaw(t, tb.Addr, 5, "cs", true, v5Expiry(60))
	if ack.SessionPresent {
		t.Fatalf("session present on a clean start [MQTT-3.2.2-2]")
	}
	c.subscribe(1, packets.Subscription{Filter: "cs/t", Qos: 1})
	c.disconnect(0)
	v5WaitOffline(t, tb.Broker, "cs")

	// Clean start 0 resumes the session [MQTT-3.1.2-5].
	c, ack = connectRaw(t, tb.Addr, 5, "cs", false, v5Expiry(60))
	if !ack.SessionPresent {
		t.Fatalf("no session present with clean start 0 [MQTT-3.2.2-3]")
	}
	pub.publish(rawPublish("cs/t", "resumed", 1, false, 1))
	c.ackPublish(c.expectPublish("cs/t", "resumed", 1))
	c.disconnect(0)
	v5WaitOffline(t, tb.Broker, "cs")

	// Clean start 1 discards it, subscriptions included [MQTT-3.1.2-4].
	c, ack = connectRaw(t, tb.Addr, 5, "cs", true, v5Expiry(60))
	if ack.SessionPresent {
		t.Fatalf("session present on a clean start [MQTT-3.2.2-2]")
	}
	pub.publish(rawPublish("cs/t", "discarded", 1, false, 2))
	c.quiet()
}

func TestV5AssignedClientID(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	a, ackA := connectRaw(t, tb.Addr, 5, "", true, v5Expiry(60))
	_, ackB := connectRaw(t, tb.Addr, 5, "", true, nil)
	idA, idB := ackA.Properties.AssignedClientID, ackB.Properties.AssignedClientID
	if idA == "" || idB == "" {
		t.Fatalf("assigned client ids %q and %q, want both set [MQTT-3.1.3-7] [MQTT-3.2.2-16]", idA, idB)
	}
	if idA == idB {
		t.Fatalf("both clients were assigned %q, want unique ids [MQTT-3.1.3-6]", idA)
	}
	// The connection was handled as if the client had sent the id
	// [MQTT-3.1.3-7]: its session is found under it.
	a.subscribe(1, packets.Subscription{Filter: "aci/t", Qos: 1})
	a.disconnect(0)
	v5WaitOffline(t, tb.Broker, idA)
	_, ack := connectRaw(t, tb.Addr, 5, idA, false, v5Expiry(60))
	if !ack.SessionPresent {
		t.Errorf("no session under the assigned id %q", idA)
	}
	if ack.Properties.AssignedClientID != "" {
		t.Errorf("assigned client id %q to a client that sent one", ack.Properties.AssignedClientID)
	}

	// Paho adopts the id from CONNACK.
	pc, pack := v5Connect(t, tb.Addr, &paho.Connect{CleanStart: true})
	if pack.Properties == nil || pack.Properties.AssignedClientID == "" || pc.ClientID() != pack.Properties.AssignedClientID {
		t.Errorf("paho client id %q, want the assigned one", pc.ClientID())
	}
}

func TestV5ServerKeepAlive(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.MaxKeepalive = time.Minute })
	for _, tc := range []struct {
		name   string
		client uint16
		server uint16 // 0: no Server Keep Alive
	}{
		{"zero replaced by the maximum", 0, 60},
		{"above the maximum replaced", 3600, 60},
		{"within the maximum kept", 45, 0},
		{"at the maximum kept", 60, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, tb.Addr, 5)
			pk := c.connectPacket("ska", true)
			pk.Connect.Keepalive = tc.client
			ack := c.connect(pk)
			p := &ack.Properties
			switch {
			case ack.ReasonCode != 0:
				t.Fatalf("got %s", rawDescribe(ack))
			case tc.server == 0 && p.ServerKeepAliveFlag:
				t.Errorf("server keep alive %d, want none: the client's value stands [MQTT-3.2.2-22]", p.ServerKeepAlive)
			case tc.server != 0 && (!p.ServerKeepAliveFlag || p.ServerKeepAlive != tc.server):
				t.Errorf("server keep alive present=%t %d, want %d (§3.2.2.3.14) [MQTT-3.2.2-21]", p.ServerKeepAliveFlag, p.ServerKeepAlive, tc.server)
			}
			c.disconnect(0)
		})
	}
}

func TestV5KeepAliveTimeout(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	watcher, _ := connectRaw(t, tb.Addr, 5, "ka-watch", true, nil)
	watcher.subscribe(1, packets.Subscription{Filter: "ka/#"})

	idle := dialRaw(t, tb.Addr, 5)
	pk := idle.connectPacket("ka-idle", true)
	pk.Connect.Keepalive = 1
	pk.Connect.WillFlag = true
	pk.Connect.WillTopic = "ka/will"
	pk.Connect.WillPayload = []byte("idle gone")
	start := time.Now()
	if ack := idle.connect(pk); ack.ReasonCode != 0 {
		t.Fatalf("got %s", rawDescribe(ack))
	}

	busy := dialRaw(t, tb.Addr, 5)
	pk = busy.connectPacket("ka-busy", true)
	pk.Connect.Keepalive = 1
	if ack := busy.connect(pk); ack.ReasonCode != 0 {
		t.Fatalf("got %s", rawDescribe(ack))
	}
	// Only silence counts: a client that keeps talking stays, well past
	// one and a half keep alive periods.
	for time.Since(start) < 2200*time.Millisecond {
		busy.ping()
		time.Sleep(400 * time.Millisecond)
	}

	// The silent client is cut after 1.5 keep alive periods, as if the
	// network had failed [MQTT-3.1.2-22]: with its will.
	idle.expectDisconnect(rcKeepAliveTimeout)
	if took := idle.lastAt.Sub(start); took < 1450*time.Millisecond || took > 3*time.Second {
		t.Errorf("silent client closed after %v, want about 1.5 s [MQTT-3.1.2-22]", took)
	}
	watcher.expectPublish("ka/will", "idle gone", 0) // [MQTT-3.1.2-8]
	busy.ping()
}

func TestV5SessionTakeover(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	watcher, _ := connectRaw(t, tb.Addr, 5, "to-watch", true, nil)
	watcher.subscribe(1, packets.Subscription{Filter: "to/will", Qos: 1})
	pub, _ := connectRaw(t, tb.Addr, 5, "to-pub", true, nil)

	first, _ := connectRaw(t, tb.Addr, 5, "to-client", true, func(pk *packets.Packet) {
		v5SetExpiry(pk, 60)
		pk.Connect.WillFlag = true
		pk.Connect.WillTopic = "to/will"
		pk.Connect.WillPayload = []byte("taken over")
		pk.Connect.WillQos = 1
	})
	first.subscribe(1, packets.Subscription{Filter: "to/data", Qos: 1})

	second, ack := connectRaw(t, tb.Addr, 5, "to-client", false, v5Expiry(60))
	if !ack.SessionPresent {
		t.Errorf("taking over with clean start 0 did not resume the session [MQTT-3.2.2-3]")
	}
	first.expectDisconnect(rcSessionTakenOver) // [MQTT-3.1.4-3]
	// The old connection's will goes out as for any closed connection
	// (§3.1.4): its delay is 0.
	watcher.expectPublish("to/will", "taken over", 1)

	// The session, with its subscription, now serves the new connection.
	pub.publish(rawPublish("to/data", "moved", 1, false, 1))
	second.ackPublish(second.expectPublish("to/data", "moved", 1))
	second.ping()
}

func TestV5FirstPacketMustBeConnect(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	for _, pk := range []*packets.Packet{
		{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}},
		rawPublish("early/t", "x", 0, false, 0),
		rawSubscribe(1, packets.Subscription{Filter: "early/#"}),
	} {
		c := dialRaw(t, tb.Addr, 5)
		c.send(pk)
		c.expectClosed() // no CONNACK, no DISCONNECT [MQTT-3.1.0-1]
	}
}

func TestV5SecondConnect(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "twice", true, nil)
	c.send(c.connectPacket("twice", true))
	// A protocol error [MQTT-3.1.0-2], not a second CONNACK [MQTT-3.2.0-2].
	d := c.expectDisconnect(rcProtocolError)
	if d.Properties.ReasonString == "" {
		t.Errorf("DISCONNECT 0x82 without a reason string (§3.14.2.2.3)")
	}
}

func TestV5ReasonStrings(t *testing.T) {
	t.Parallel()

	t.Run("refused CONNECT", func(t *testing.T) {
		t.Parallel()
		tb := startBroker(t, func(o *Options) { o.AllowAnonymous = false })
		c := dialRaw(t, tb.Addr, 5)
		ack := c.connect(c.connectPacket("anon", false))
		if ack.ReasonCode != rcNotAuthorized || ack.SessionPresent {
			t.Fatalf("got %s, want reason 0x87 without a session [MQTT-3.2.2-6]", rawDescribe(ack))
		}
		if ack.Properties.ReasonString == "" {
			t.Errorf("CONNACK 0x87 without a reason string (§3.2.2.3.9)")
		}
		c.expectClosed() // [MQTT-3.2.2-7]
	})

	t.Run("refused PUBLISH", func(t *testing.T) {
		t.Parallel()
		tb := startBroker(t, func(o *Options) {
			o.ACL = []auth.ACLRule{{User: "*", Topic: "open/#", Access: "readwrite"}}
		})
		told, _ := connectRaw(t, tb.Addr, 5, "rs-told", true, nil)
		told.send(rawPublish("closed/t", "x", 1, false, 1))
		ack := told.expectAck(packets.Puback, 1, rcNotAuthorized)
		if ack.Properties.ReasonString == "" {
			t.Errorf("PUBACK 0x87 without a reason string (§3.4.2.2.2)")
		}
		// A client that asked for no problem information gets the code
		// alone [MQTT-3.1.2-29].
		quiet, _ := connectRaw(t, tb.Addr, 5, "rs-quiet", true, func(pk *packets.Packet) {
			pk.Properties.RequestProblemInfo = 0
			pk.Properties.RequestProblemInfoFlag = true
		})
		quiet.send(rawPublish("closed/t", "x", 1, false, 1))
		ack = quiet.expectAck(packets.Puback, 1, rcNotAuthorized)
		if ack.Properties.ReasonString != "" || len(ack.Properties.User) > 0 {
			t.Errorf("got %s, want no reason string or user property [MQTT-3.1.2-29]", rawDescribe(ack))
		}
		quiet.publish(rawPublish("open/t", "x", 1, false, 2))
	})
}

func TestV5MaximumPacketSizeToBroker(t *testing.T) {
	t.Parallel()
	const max = 512
	tb := startBroker(t, func(o *Options) { o.MaxPacketSize = max })
	c, ack := connectRaw(t, tb.Addr, 5, "mps-in", true, nil)
	if ack.Properties.MaximumPacketSize != max {
		t.Fatalf("CONNACK maximum packet size %d, want %d (§3.2.2.3.6)", ack.Properties.MaximumPacketSize, max)
	}
	c.sendBytes(v5SizedPublish(c, "mps/in", max, 1))
	c.expectAck(packets.Puback, 1, 0)
	// One byte over: DISCONNECT 0x95 (§3.2.2.3.6, §4.13).
	c.sendBytes(v5SizedPublish(c, "mps/in", max+1, 2))
	c.expectDisconnect(rcPacketTooLarge)
}

// v5SizedPublish returns a QoS 1 PUBLISH to topic exactly size bytes long.
func v5SizedPublish(c *rawClient, topic string, size int, pid uint16) []byte {
	c.t.Helper()
	pk := rawPublish(topic, "", 1, false, pid)
	for range 4 {
		b := c.encode(pk)
		if len(b) == size {
			return b
		}
		n := len(pk.Payload) + size - len(b)
		if n < 0 {
			break
		}
		pk.Payload = bytes.Repeat([]byte{'x'}, n)
	}
	c.t.Fatalf("cannot make a PUBLISH of %d bytes to %q", size, topic)
	return nil
}

func TestV5MaximumPacketSizeToClient(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	pub, _ := connectRaw(t, tb.Addr, 5, "mpo-pub", true, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "mpo", true, func(pk *packets.Packet) {
		pk.Properties.MaximumPacketSize = 128
		pk.Properties.ReceiveMaximum = 1
	})
	c.subscribe(1, packets.Subscription{Filter: "mpo/#", Qos: 1})
	pub.publish(rawPublish("mpo/big", strings.Repeat("x", 300), 1, false, 1))
	pub.publish(rawPublish("mpo/big", strings.Repeat("y", 300), 0, false, 0))
	pub.publish(rawPublish("mpo/small", "fits", 1, false, 2))
	// Too large for the client: never sent [MQTT-3.1.2-24], and handled
	// as delivered [MQTT-3.1.2-25], so that it does not hold the window
	// of one the client allows.
	m := c.expectPublish("mpo/small", "fits", 1)
	c.ackPublish(m)
	c.quiet()
}

func TestV5ShutdownDisconnects(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	raw, _ := connectRaw(t, tb.Addr, 5, "sd-raw", true, nil)
	pc, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "sd-paho", CleanStart: true})

	ctx, cancel := context.WithTimeout(context.Background(), rawWait)
	defer cancel()
	if err := tb.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	raw.expectDisconnect(rcShuttingDown) // §3.14.2.1: 0x8B Server shutting down
	select {
	case d := <-pc.gone:
		if d.ReasonCode != rcShuttingDown {
			t.Errorf("paho client got DISCONNECT 0x%02X, want 0x8B", d.ReasonCode)
		}
	case <-time.After(rawWait):
		t.Errorf("paho client got no DISCONNECT")
	}
	if nc, err := net.DialTimeout("tcp", tb.Addr, testkit.Scale(time.Second)); err == nil {
		nc.Close()
		t.Errorf("broker still accepts connections after Shutdown")
	}
}

func TestV5SysTopics(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.SysInterval = time.Second })
	all, _ := connectRaw(t, tb.Addr, 5, "sys-all", true, nil)
	all.subscribe(1, packets.Subscription{Filter: "#"}, packets.Subscription{Filter: "+/broker/#"})
	sys, _ := connectRaw(t, tb.Addr, 5, "sys", true, nil)
	sys.subscribe(1, packets.Subscription{Filter: "$SYS/broker/#"})

	// Two rounds, one interval apart.
	seen := map[string]int{}
	var rounds []time.Time
	for len(rounds) < 2 {
		m := sys.expect(packets.Publish)
		seen[m.TopicName]++
		switch m.TopicName {
		case "$SYS/broker/uptime":
			rounds = append(rounds, sys.lastAt)
		case "$SYS/broker/version":
			if string(m.Payload) != "test" {
				t.Errorf("$SYS/broker/version = %q, want %q", m.Payload, "test")
			}
		}
	}
	if gap := rounds[1].Sub(rounds[0]); gap < 500*time.Millisecond || gap > 1900*time.Millisecond {
		t.Errorf("$SYS rounds %v apart, want the 1 s interval", gap)
	}
	for _, topic := range []string{"version", "clients/connected", "messages/received", "subscriptions/count"} {
		if seen["$SYS/broker/"+topic] == 0 {
			t.Errorf("no $SYS/broker/%s", topic)
		}
	}
	// Filters starting with a wildcard never match $ topics [MQTT-4.7.2-1].
	all.expectNone(rawQuiet)
}
