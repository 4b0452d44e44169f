package broker

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
)

// MQTT 5.0 conformance of PUBLISH: QoS flows, packet identifiers,
// redelivery, flow control, topic aliases, message expiry and the
// properties a message carries.

func TestV5PublishQoSFlows(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	pub, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "flow-pub", CleanStart: true})
	var subs []*v5Client
	for qos := byte(0); qos <= 2; qos++ {
		sub, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: fmt.Sprintf("flow-sub%d", qos), CleanStart: true})
		codes := sub.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "flow/#", QoS: qos}}})
		if !bytes.Equal(codes, []byte{qos}) {
			t.Fatalf("SUBACK % X, want granted QoS %d (§3.9.3)", codes, qos)
		}
		subs = append(subs, sub)
	}
	for qos := byte(0); qos <= 2; qos++ {
		payload := fmt.Sprintf("at QoS %d", qos)
		// Paho completes the flow: PUBACK, or PUBREC, PUBREL, PUBCOMP
		// [MQTT-4.3.2-4] [MQTT-4.3.3-8] [MQTT-4.3.3-11].
		pub.publish(&paho.Publish{Topic: "flow/t", QoS: qos, Payload: []byte(payload)})
		for subQoS, sub := range subs {
			m := sub.next()
			want := min(qos, byte(subQoS)) // [MQTT-3.8.4-8]
			if m.Topic != "flow/t" || string(m.Payload) != payload || m.QoS != want {
				t.Errorf("subscriber at QoS %d got %q %q QoS %d, want %q QoS %d", subQoS, m.Topic, m.Payload, m.QoS, payload, want)
			}
		}
	}
	for _, sub := range subs {
		sub.expectNone(rawQuiet) // each exactly once [MQTT-4.3.3-10]
	}
}

func TestV5PacketIdentifierReuse(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	sub, _ := connectRaw(t, tb.Addr, 5, "pid-sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "pid/#", Qos: 1})
	p, _ := connectRaw(t, tb.Addr, 5, "pid-pub", true, nil)
	got := func(topic, payload string) {
		t.Helper()
		sub.ackPublish(sub.expectPublish(topic, payload, 1))
	}

	// QoS 1: once PUBACK is sent, the identifier starts a new message
	// [MQTT-4.3.2-5].
	p.publish(rawPublish("pid/1", "first", 1, false, 7))
	p.publish(rawPublish("pid/1", "second", 1, false, 7))
	got("pid/1", "first")
	got("pid/1", "second")

	// QoS 2: until PUBREL, the identifier names the same message: a
	// resend is acknowledged again and not delivered twice
	// [MQTT-4.3.3-10].
	p.send(rawPublish("pid/2", "once", 2, false, 9))
	p.expectAck(packets.Pubrec, 9, 0) // [MQTT-4.3.3-8]
	dup := rawPublish("pid/2", "once", 2, false, 9)
	dup.FixedHeader.Dup = true
	p.send(dup)
	p.expectAck(packets.Pubrec, 9, 0)
	p.send(rawAck(packets.Pubrel, 9, 0))
	p.expectAck(packets.Pubcomp, 9, 0) // [MQTT-4.3.3-11]
	// After PUBCOMP the identifier starts a new message [MQTT-4.3.3-12].
	p.publish(rawPublish("pid/2", "again", 2, false, 9))
	got("pid/2", "once")
	got("pid/2", "again")
	sub.quiet()

	// PUBREL for an identifier the broker does not hold: PUBCOMP 0x92
	// (§3.7.2.1).
	p.send(rawAck(packets.Pubrel, 77, 0))
	p.expectAck(packets.Pubcomp, 77, 0x92)
}

// TestV5RefusedQoS2FreesItsIdentifier: a QoS 2 publish refused in its
// PUBREC (0x97 here, for the retained bound; delivered, not retained)
// ends its flow there, so the client's next PUBLISH under that identifier
// is a new message, delivered, not taken for a resend and lost
// [MQTT-4.3.3-9]. A persistent session's identifier is free after a
// restart too.
func TestV5RefusedQoS2FreesItsIdentifier(t *testing.T) {
	t.Parallel()
	sb := newStoredBroker(t, func(o *Options) { o.MaxRetainedPerUser = 1 })
	sub, _ := connectRaw(t, sb.tb.Addr, 5, "sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "t/#", Qos: 2})
	pub, _ := connectRaw(t, sb.tb.Addr, 5, "pub", false, asUser("alice", 3600))
	got := func(topic, payload string) {
		t.Helper()
		sub.ackPublish(sub.expectPublish(topic, payload, 2))
	}
	refused := func(topic, payload string, pid uint16) {
		t.Helper()
		pub.send(rawPublish(topic, payload, 2, true, pid))
		pub.expectAck(packets.Pubrec, pid, rcQuotaExceeded)
		got(topic, payload)
	}

	pub.publish(rawPublish("t/1", "a", 2, true, 1)) // alice's one retained message
	got("t/1", "a")
	refused("t/2", "b", 2)
	pub.publish(rawPublish("t/3", "c", 2, false, 2)) // identifier 2 again: a new message
	got("t/3", "c")
	refused("t/4", "d", 3)
	pub.close()
	sub.close()

	sb.restart()
	sub, _ = connectRaw(t, sb.tb.Addr, 5, "sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "t/5", Qos: 2}) // not t/1's retained message
	pub, ack := connectRaw(t, sb.tb.Addr, 5, "pub", false, asUser("alice", 3600))
	if !ack.SessionPresent {
		t.Fatal("the publisher's session did not survive the restart")
	}
	pub.publish(rawPublish("t/5", "e", 2, false, 3)) // refused before the restart: free
	got("t/5", "e")
}

func TestV5OutboundQoS2Flow(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "q2-sub", true, v5Expiry(60))
	c.subscribe(1, packets.Subscription{Filter: "q2/#", Qos: 2})
	p, _ := connectRaw(t, tb.Addr, 5, "q2-pub", true, nil)
	p.publish(rawPublish("q2/a", "a", 2, false, 1))
	p.publish(rawPublish("q2/b", "b", 2, false, 2))

	a := c.expectPublish("q2/a", "a", 2)
	b := c.expectPublish("q2/b", "b", 2)
	if a.FixedHeader.Dup || b.FixedHeader.Dup {
		t.Errorf("first delivery with DUP set [MQTT-4.3.3-2] [MQTT-3.3.1-3]")
	}
	if a.PacketID == 0 || b.PacketID == 0 || a.PacketID == b.PacketID {
		t.Errorf("packet identifiers %d and %d, want distinct non-zero ones [MQTT-2.2.1-4]", a.PacketID, b.PacketID)
	}
	// PUBREC is answered with PUBREL for the same identifier
	// [MQTT-4.3.3-4]; the decoder checks PUBREL's header flags
	// [MQTT-3.6.1-1].
	c.send(rawAck(packets.Pubrec, a.PacketID, 0))
	c.expectAck(packets.Pubrel, a.PacketID, 0)
	c.send(rawAck(packets.Pubcomp, a.PacketID, 0))
	c.send(rawAck(packets.Pubrec, b.PacketID, 0))
	c.expectAck(packets.Pubrel, b.PacketID, 0)
	c.send(rawAck(packets.Pubcomp, b.PacketID, 0))

	// A PUBREC with a failure code ends the exchange: no PUBREL
	// [MQTT-4.3.3-4], and the message is not sent again [MQTT-4.4.0-2].
	p.publish(rawPublish("q2/c", "c", 2, false, 3))
	m := c.expectPublish("q2/c", "c", 2)
	c.send(rawAck(packets.Pubrec, m.PacketID, 0x80))
	c.quiet()
	c.close()
	v5WaitOffline(t, tb.Broker, "q2-sub")
	c, _ = connectRaw(t, tb.Addr, 5, "q2-sub", false, v5Expiry(60))
	c.quiet()
}

func TestV5RedeliveryQoS1(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	edit := func(pk *packets.Packet) {
		v5SetExpiry(pk, 60)
		pk.Properties.ReceiveMaximum = 3
	}
	c, _ := connectRaw(t, tb.Addr, 5, "rd1", true, edit)
	c.subscribe(1, packets.Subscription{Filter: "rd/#", Qos: 1})
	p, _ := connectRaw(t, tb.Addr, 5, "rd1-pub", true, nil)
	for i := range 5 {
		p.publish(rawPublish("rd/t", strconv.Itoa(i), 1, false, uint16(i+1)))
	}
	var sent []*packets.Packet
	for i := range 3 {
		m := c.expectPublish("rd/t", strconv.Itoa(i), 1)
		if m.FixedHeader.Dup {
			t.Errorf("first delivery with DUP set [MQTT-4.3.2-2]")
		}
		sent = append(sent, m)
	}
	c.quiet() // the window of 3 is full
	c.close() // unacknowledged, then gone
	v5WaitOffline(t, tb.Broker, "rd1")

	c, ack := connectRaw(t, tb.Addr, 5, "rd1", false, edit)
	if !ack.SessionPresent {
		t.Fatalf("no session present [MQTT-3.2.2-3]")
	}
	// Unacknowledged messages again, with their identifiers, DUP set,
	// in their original order [MQTT-4.4.0-1] [MQTT-3.3.1-1] [MQTT-4.6.0-5].
	for _, was := range sent {
		m := c.expectPublish(was.TopicName, string(was.Payload), 1)
		if m.PacketID != was.PacketID || !m.FixedHeader.Dup {
			t.Errorf("got %s, want id %d with DUP", rawDescribe(m), was.PacketID)
		}
	}
	c.quiet()
	c.send(rawAck(packets.Puback, sent[0].PacketID, 0))
	m := c.expectPublish("rd/t", "3", 1)
	if m.FixedHeader.Dup || m.PacketID == sent[1].PacketID || m.PacketID == sent[2].PacketID {
		t.Errorf("got %s, want a first delivery with an unused id [MQTT-2.2.1-4]", rawDescribe(m))
	}
	for _, pid := range []uint16{sent[1].PacketID, sent[2].PacketID, m.PacketID} {
		c.send(rawAck(packets.Puback, pid, 0))
	}
	c.ackPublish(c.expectPublish("rd/t", "4", 1))
	c.quiet() // nothing resent once acknowledged [MQTT-4.4.0-1]
}

func TestV5RedeliveryQoS2(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "rd2", true, v5Expiry(60))
	c.subscribe(1, packets.Subscription{Filter: "rd2/#", Qos: 2})
	p, _ := connectRaw(t, tb.Addr, 5, "rd2-pub", true, nil)
	p.publish(rawPublish("rd2/a", "a", 2, false, 1))
	p.publish(rawPublish("rd2/b", "b", 2, false, 2))
	a := c.expectPublish("rd2/a", "a", 2)
	b := c.expectPublish("rd2/b", "b", 2)
	c.send(rawAck(packets.Pubrec, a.PacketID, 0))
	c.expectAck(packets.Pubrel, a.PacketID, 0)
	c.close() // a waits for PUBCOMP, b for PUBREC
	v5WaitOffline(t, tb.Broker, "rd2")

	c, ack := connectRaw(t, tb.Addr, 5, "rd2", false, v5Expiry(60))
	if !ack.SessionPresent {
		t.Fatalf("no session present [MQTT-3.2.2-3]")
	}
	// a: PUBREL again, never its PUBLISH [MQTT-4.3.3-6]; b: PUBLISH
	// again with DUP [MQTT-4.4.0-1] [MQTT-3.3.1-1].
	c.expectAck(packets.Pubrel, a.PacketID, 0)
	m := c.expectPublish("rd2/b", "b", 2)
	if m.PacketID != b.PacketID || !m.FixedHeader.Dup {
		t.Errorf("got %s, want id %d with DUP", rawDescribe(m), b.PacketID)
	}
	c.send(rawAck(packets.Pubcomp, a.PacketID, 0))
	c.ackPublish(m)
	c.quiet()
}

func TestV5ReceiveMaximumToClient(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "rm-out", true, func(pk *packets.Packet) { pk.Properties.ReceiveMaximum = 2 })
	c.subscribe(1, packets.Subscription{Filter: "rm/#", Qos: 1})
	p, _ := connectRaw(t, tb.Addr, 5, "rm-pub", true, nil)
	// One topic, so that the order is the publisher's [MQTT-4.6.0-5].
	for i := range 5 {
		p.publish(rawPublish("rm/t", strconv.Itoa(i), 1, false, uint16(i+1)))
	}
	m0 := c.expectPublish("rm/t", "0", 1)
	m1 := c.expectPublish("rm/t", "1", 1)
	// Two unacknowledged: the client's maximum [MQTT-3.3.4-9]. The
	// PINGREQ of quiet is answered all the same [MQTT-3.3.4-10], and
	// QoS 0 messages, which the window does not count (§3.3.4), pass.
	c.quiet()
	p.publish(rawPublish("rm/q0", "q0", 0, false, 0))
	c.expectPublish("rm/q0", "q0", 0)

	c.send(rawAck(packets.Puback, m0.PacketID, 0))
	m2 := c.expectPublish("rm/t", "2", 1)
	c.quiet()
	c.send(rawAck(packets.Puback, m1.PacketID, 0), rawAck(packets.Puback, m2.PacketID, 0))
	m3 := c.expectPublish("rm/t", "3", 1)
	m4 := c.expectPublish("rm/t", "4", 1)
	c.send(rawAck(packets.Puback, m3.PacketID, 0), rawAck(packets.Puback, m4.PacketID, 0))
	c.quiet()
}

func TestV5ReceiveMaximumFromClient(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.ReceiveMaximum = 2 })
	c, ack := connectRaw(t, tb.Addr, 5, "rm-in", true, nil)
	if ack.Properties.ReceiveMaximum != 2 {
		t.Fatalf("CONNACK receive maximum %d, want 2 (§3.2.2.3.3)", ack.Properties.ReceiveMaximum)
	}
	// QoS 1 is acknowledged at once, so it never fills the window.
	for pid := uint16(1); pid <= 4; pid++ {
		c.publish(rawPublish("rm/in", "q1", 1, false, pid))
	}
	c.send(rawPublish("rm/in", "1", 2, false, 11))
	c.expectAck(packets.Pubrec, 11, 0)
	c.send(rawPublish("rm/in", "2", 2, false, 12))
	c.expectAck(packets.Pubrec, 12, 0)
	// A resend of one in flight is not a new one.
	dup := rawPublish("rm/in", "1", 2, false, 11)
	dup.FixedHeader.Dup = true
	c.send(dup)
	c.expectAck(packets.Pubrec, 11, 0)
	c.send(rawAck(packets.Pubrel, 11, 0))
	c.expectAck(packets.Pubcomp, 11, 0)
	c.send(rawPublish("rm/in", "3", 2, false, 13))
	c.expectAck(packets.Pubrec, 13, 0)
	// A third unacknowledged one exceeds the maximum [MQTT-3.3.4-7]:
	// DISCONNECT 0x93 (§3.3.4).
	c.send(rawPublish("rm/in", "4", 2, false, 14))
	c.expectDisconnect(rcReceiveMaxExceeded)
}

// v5PublishAlias builds a PUBLISH carrying topic alias alias.
func v5PublishAlias(topic, payload string, alias uint16) *packets.Packet {
	pk := rawPublish(topic, payload, 0, false, 0)
	pk.Properties.TopicAlias = alias
	pk.Properties.TopicAliasFlag = true
	return pk
}

// v5AliasZero is a QoS 0 PUBLISH with an empty topic and topic alias 0,
// which the codec refuses to write.
var v5AliasZero = []byte{
	packets.Publish << 4, 7,
	0, 0, // topic ""
	3, 0x23, 0, 0, // properties: topic alias 0
	'x', 'y',
}

func TestV5TopicAliasFromClient(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.TopicAliasMax = 3 })
	sub, _ := connectRaw(t, tb.Addr, 5, "tai-sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "tai/#"})

	t.Run("set, use and replace", func(t *testing.T) {
		c, _ := connectRaw(t, tb.Addr, 5, "tai", true, nil)
		// Every alias from 1 to the maximum is accepted [MQTT-3.3.2-12].
		c.send(v5PublishAlias("tai/one", "a", 1), v5PublishAlias("tai/three", "b", 3))
		c.send(v5PublishAlias("", "c", 1), v5PublishAlias("", "d", 3))
		c.send(v5PublishAlias("tai/two", "e", 1), v5PublishAlias("", "f", 1)) // replaced (§3.3.4)
		c.ping()
		sub.expectPublish("tai/one", "a", 0)
		sub.expectPublish("tai/three", "b", 0)
		sub.expectPublish("tai/one", "c", 0)
		sub.expectPublish("tai/three", "d", 0)
		sub.expectPublish("tai/two", "e", 0)
		sub.expectPublish("tai/two", "f", 0)
		c.disconnect(0)

		// Mappings end with their connection [MQTT-3.3.2-7].
		c, _ = connectRaw(t, tb.Addr, 5, "tai", true, nil)
		c.send(v5PublishAlias("", "g", 1))
		c.expectDisconnect(rcProtocolError)
		sub.quiet()
	})

	for _, tc := range []struct {
		name string
		pk   *packets.Packet
		raw  []byte
		code byte
	}{
		// An alias with no mapping and no topic (§3.3.4).
		{"unknown alias", v5PublishAlias("", "x", 2), nil, rcProtocolError},
		// Above the broker's maximum (§3.3.4) [MQTT-3.3.2-9].
		{"alias above maximum", v5PublishAlias("tai/x", "x", 4), nil, rcTopicAliasInvalid},
		// Zero is never an alias (§3.3.4) [MQTT-3.3.2-8].
		{"alias zero", nil, v5AliasZero, rcTopicAliasInvalid},
		// Neither topic nor alias (§3.3.2.3.4).
		{"no topic, no alias", rawPublish("", "x", 0, false, 0), nil, rcProtocolError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := connectRaw(t, tb.Addr, 5, "tai-bad", true, nil)
			if tc.pk != nil {
				c.send(tc.pk)
			} else {
				c.sendBytes(tc.raw)
			}
			c.expectDisconnect(tc.code)
		})
	}
	sub.quiet()
}

// v5AliasTable resolves the topic aliases a broker sends one connection,
// failing the test on any the spec forbids.
type v5AliasTable struct {
	t       testing.TB
	max     uint16
	topics  map[uint16]string
	aliased int // messages that came as an alias alone
}

func (a *v5AliasTable) topic(pk *packets.Packet) string {
	a.t.Helper()
	p := &pk.Properties
	if !p.TopicAliasFlag {
		if pk.TopicName == "" {
			a.t.Fatalf("got %s without topic or alias", rawDescribe(pk))
		}
		return pk.TopicName
	}
	if a.max == 0 {
		a.t.Fatalf("got %s, want no alias: the client allows none [MQTT-3.1.2-27]", rawDescribe(pk))
	}
	if p.TopicAlias == 0 || p.TopicAlias > a.max {
		a.t.Fatalf("got %s, want an alias from 1 to %d [MQTT-3.3.2-8] [MQTT-3.3.2-11] [MQTT-3.1.2-26]", rawDescribe(pk), a.max)
	}
	if pk.TopicName != "" {
		a.topics[p.TopicAlias] = pk.TopicName
		return pk.TopicName
	}
	topic, ok := a.topics[p.TopicAlias]
	if !ok {
		a.t.Fatalf("got %s: alias %d was never set on this connection", rawDescribe(pk), p.TopicAlias)
	}
	a.aliased++
	return topic
}

func TestV5TopicAliasToClient(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	p, _ := connectRaw(t, tb.Addr, 5, "tao-pub", true, nil)
	topics := []string{"tao/1", "tao/1", "tao/2", "tao/3", "tao/3", "tao/2", "tao/1"}
	run := func(t *testing.T, max uint16) *v5AliasTable {
		c, _ := connectRaw(t, tb.Addr, 5, "tao", true, func(pk *packets.Packet) { pk.Properties.TopicAliasMaximum = max })
		c.subscribe(1, packets.Subscription{Filter: "tao/#"})
		for i, topic := range topics {
			p.publish(rawPublish(topic, strconv.Itoa(i), 0, false, 0))
		}
		aliases := &v5AliasTable{t: t, max: max, topics: map[uint16]string{}}
		for i, topic := range topics {
			m := c.expect(packets.Publish)
			if got := aliases.topic(m); got != topic || string(m.Payload) != strconv.Itoa(i) {
				t.Fatalf("message %d: got %q %q, want %q", i, got, m.Payload, topic)
			}
		}
		c.disconnect(0)
		return aliases
	}

	t.Run("allowed", func(t *testing.T) {
		if a := run(t, 2); a.aliased == 0 {
			t.Errorf("no alias used though the client allows 2")
		}
		// A new connection starts without mappings [MQTT-3.3.2-7]: the
		// first message of each topic must carry the topic again.
		run(t, 2)
	})
	t.Run("not allowed", func(t *testing.T) { run(t, 0) })
}

func TestV5TopicAliasNotSpentOnDiscardedMessage(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	p, _ := connectRaw(t, tb.Addr, 5, "tad-pub", true, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "tad", true, func(pk *packets.Packet) {
		pk.Properties.TopicAliasMaximum = 2
		pk.Properties.MaximumPacketSize = 128
	})
	c.subscribe(1, packets.Subscription{Filter: "tad/#"})
	// Too large for the client: discarded [MQTT-3.1.2-25]; an alias it
	// would have set never reached the client either.
	p.publish(rawPublish("tad/t", strings.Repeat("x", 200), 0, false, 0))
	p.publish(rawPublish("tad/t", "small", 0, false, 0))
	p.publish(rawPublish("tad/t", "again", 0, false, 0))
	aliases := &v5AliasTable{t: t, max: 2, topics: map[uint16]string{}}
	for _, payload := range []string{"small", "again"} {
		m := c.expect(packets.Publish)
		if got := aliases.topic(m); got != "tad/t" || string(m.Payload) != payload {
			t.Fatalf("got %q %q, want %q %q", got, m.Payload, "tad/t", payload)
		}
	}
}

func TestV5MessageExpiry(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	p, _ := connectRaw(t, tb.Addr, 5, "me-pub", true, nil)
	expiring := func(topic, payload string, seconds uint32, retain bool, pid uint16) *packets.Packet {
		pk := rawPublish(topic, payload, 1, retain, pid)
		pk.Properties.MessageExpiryInterval = seconds
		return pk
	}

	c, _ := connectRaw(t, tb.Addr, 5, "me", true, v5Expiry(60))
	c.subscribe(1, packets.Subscription{Filter: "me/#", Qos: 1})

	// Delivered at once: the interval as published, less nothing.
	p.publish(expiring("me/now", "now", 10, false, 1))
	m := c.expectPublish("me/now", "now", 1)
	if e := m.Properties.MessageExpiryInterval; e < 9 || e > 10 {
		t.Errorf("message expiry %d on immediate delivery, want 10 [MQTT-3.3.2-6]", e)
	}
	c.ackPublish(m)
	c.disconnect(0)
	v5WaitOffline(t, tb.Broker, "me")

	p.publish(expiring("me/long", "long", 10, false, 2))
	p.publish(expiring("me/short", "short", 1, false, 3))
	p.publish(rawPublish("me/none", "none", 1, false, 4))
	p.publish(expiring("me/retained-short", "r1", 1, true, 5))
	p.publish(expiring("me/retained-long", "r2", 60, true, 6))
	time.Sleep(1500 * time.Millisecond) // the spec's timing is the point

	c, _ = connectRaw(t, tb.Addr, 5, "me", false, v5Expiry(60))
	// The interval counts down while the message waits [MQTT-3.3.2-6];
	// an expired one is not delivered [MQTT-3.3.2-5].
	m = c.expectPublish("me/long", "long", 1)
	if e := m.Properties.MessageExpiryInterval; e < 1 || e > 9 {
		t.Errorf("message expiry %d after waiting 1.5 s, want 1 to 9 [MQTT-3.3.2-6]", e)
	}
	c.ackPublish(m)
	m = c.expectPublish("me/none", "none", 1)
	if m.Properties.MessageExpiryInterval != 0 {
		t.Errorf("message expiry %d on a message published without one", m.Properties.MessageExpiryInterval)
	}
	c.ackPublish(m)
	m = c.expectPublish("me/retained-long", "r2", 1)
	c.ackPublish(m)
	c.quiet()

	// Retained messages expire too [MQTT-3.3.2-5], and count down.
	r, _ := connectRaw(t, tb.Addr, 5, "me-late", true, nil)
	r.subscribe(1, packets.Subscription{Filter: "me/+", Qos: 1})
	m = r.expectPublish("me/retained-long", "r2", 1)
	if e := m.Properties.MessageExpiryInterval; e < 1 || e > 59 {
		t.Errorf("retained message expiry %d after 1.5 s, want below 60 [MQTT-3.3.2-6]", e)
	}
	r.ackPublish(m)
	r.quiet()
}

func TestV5PublishPropertiesPassThrough(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	plain, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "pp-plain", CleanStart: true})
	plain.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "pp/#", QoS: 1}}})
	// A subscription identifier makes the broker encode this receiver's
	// copy on its own: the properties must survive that path too.
	subID := 42
	ided, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "pp-id", CleanStart: true})
	ided.subscribe(&paho.Subscribe{
		Properties:    &paho.SubscribeProperties{SubscriptionIdentifier: &subID},
		Subscriptions: []paho.SubscribeOptions{{Topic: "pp/#", QoS: 1}},
	})
	pub, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "pp-pub", CleanStart: true})

	format := byte(1)
	want := &paho.PublishProperties{
		PayloadFormat:   &format,
		ContentType:     "application/json",
		ResponseTopic:   "pp/reply",
		CorrelationData: []byte{0, 1, 2, 0xFF},
		User:            paho.UserProperties{{Key: "k1", Value: "v1"}, {Key: "k2", Value: "v2"}, {Key: "k1", Value: "v3"}},
	}
	pub.publish(&paho.Publish{Topic: "pp/t", QoS: 1, Payload: []byte(`{"a":1}`), Properties: want})
	for _, c := range []*v5Client{plain, ided} {
		m := c.next()
		got := m.Properties
		switch {
		case string(m.Payload) != `{"a":1}`:
			t.Errorf("%s: payload %q", c.ClientID(), m.Payload)
		case got == nil:
			t.Fatalf("%s: no properties", c.ClientID())
		}
		if got.PayloadFormat == nil || *got.PayloadFormat != 1 {
			t.Errorf("%s: payload format %v, want 1 [MQTT-3.3.2-4]", c.ClientID(), got.PayloadFormat)
		}
		if got.ContentType != want.ContentType {
			t.Errorf("%s: content type %q [MQTT-3.3.2-20]", c.ClientID(), got.ContentType)
		}
		if got.ResponseTopic != want.ResponseTopic {
			t.Errorf("%s: response topic %q [MQTT-3.3.2-15]", c.ClientID(), got.ResponseTopic)
		}
		if !bytes.Equal(got.CorrelationData, want.CorrelationData) {
			t.Errorf("%s: correlation data % X [MQTT-3.3.2-16]", c.ClientID(), got.CorrelationData)
		}
		if !slices.Equal(got.User, want.User) {
			t.Errorf("%s: user properties %v, want %v in order [MQTT-3.3.2-17] [MQTT-3.3.2-18]", c.ClientID(), got.User, want.User)
		}
		if got.MessageExpiry != nil {
			t.Errorf("%s: message expiry %d on a message published without one", c.ClientID(), *got.MessageExpiry)
		}
		if c == ided && (got.SubscriptionIdentifier == nil || *got.SubscriptionIdentifier != subID) {
			t.Errorf("%s: subscription identifier %v, want %d [MQTT-3.3.4-3]", c.ClientID(), got.SubscriptionIdentifier, subID)
		}
	}
}
