package broker

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Conformance cases the other tests did not reach: rules on MQTT 5
// properties that the codec decodes without enforcing, the layout of a
// CONNECT payload, and reason strings that must give way to the client's
// Maximum Packet Size. Statements without a number are cited by section.

// auditProps builds an MQTT 5 property block: its length, then props.
func auditProps(props ...[]byte) []byte {
	body := bytes.Join(props, nil)
	return append(mqttwire.AppendVarint(nil, len(body)), body...)
}

// auditProp encodes one property: its identifier, then value as given.
func auditProp(id byte, value ...byte) []byte { return append([]byte{id}, value...) }

// auditU16 and auditU32 encode two- and four-byte integers.
func auditU16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func auditU32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// auditConnect5 builds an MQTT 5 CONNECT with the property block props;
// rest follows the client identifier (will properties, will topic and
// payload, user name, password) as flags announce them.
func auditConnect5(flags byte, props []byte, id string, rest ...[]byte) []byte {
	vh := append(wireStr("MQTT"), 5, flags, 0, 0)
	return wireFrame(wireCONNECT, append([][]byte{vh, props, wireStr(id)}, rest...)...)
}

// auditPublish5 builds an MQTT 5 PUBLISH with the property block props.
func auditPublish5(flags byte, topic string, pid uint16, props []byte, payload string) []byte {
	parts := [][]byte{wireStr(topic)}
	if flags&0x06 != 0 {
		parts = append(parts, wireU16(pid))
	}
	return wireFrame(wirePUBLISH|flags, append(parts, props, []byte(payload))...)
}

var (
	auditExpiry1  = auditProp(packets.PropSessionExpiryInterval, auditU32(60)...)
	auditExpiry2  = auditProp(packets.PropSessionExpiryInterval, auditU32(120)...)
	auditUserProp = auditProp(packets.PropUser, append(wireStr("k"), wireStr("v")...)...)
)

// TestAuditConnectProperties sends CONNECTs whose properties break a rule
// the spec states: a server that accepted them would act on a value the
// client never validly sent. MQTT 5 answers with CONNACK and the reason
// code, then closes [MQTT-3.1.4-2]; MQTT 3.1.1 closes without CONNACK
// [MQTT-3.1.4-1] (3.1.1).
func TestAuditConnectProperties(t *testing.T) {
	runMalformed(t, startMalformedBroker(t).Addr, []malformedCase{
		// §2.2.2.2, §3.1.2.11.2: each property at most once.
		{"session expiry twice", 0, auditConnect5(wireClean, auditProps(auditExpiry1, auditExpiry2), "c"), rcProtocolError},
		{"receive maximum twice", 0, auditConnect5(wireClean, auditProps(
			auditProp(packets.PropReceiveMaximum, auditU16(5)...),
			auditProp(packets.PropReceiveMaximum, auditU16(6)...)), "c"), rcProtocolError},
		// §3.1.2.11.3: Receive Maximum 0 is a protocol error.
		{"receive maximum 0", 0, auditConnect5(wireClean, auditProps(auditProp(packets.PropReceiveMaximum, auditU16(0)...)), "c"), rcProtocolError},
		// §3.1.2.11.4: Maximum Packet Size 0 is a protocol error.
		{"maximum packet size 0", 0, auditConnect5(wireClean, auditProps(auditProp(packets.PropMaximumPacketSize, auditU32(0)...)), "c"), rcProtocolError},
		// §3.1.2.11.6, §3.1.2.11.7: 0 or 1 only.
		{"request response information 2", 0, auditConnect5(wireClean, auditProps(auditProp(packets.PropRequestResponseInfo, 2)), "c"), rcProtocolError},
		{"request problem information 2", 0, auditConnect5(wireClean, auditProps(auditProp(packets.PropRequestProblemInfo, 2)), "c"), rcProtocolError},
		// §3.1.2.11.10: authentication data needs an authentication method.
		{"authentication data without method", 0, auditConnect5(wireClean, auditProps(auditProp(packets.PropAuthenticationData, wireStr("x")...)), "c"), rcProtocolError},
		// §3.1.3.2: will properties follow the same rules.
		{"will delay twice", 0, auditConnect5(wireClean|wireWill, auditProps(), "c",
			auditProps(auditProp(packets.PropWillDelayInterval, auditU32(1)...), auditProp(packets.PropWillDelayInterval, auditU32(2)...)),
			wireStr("will/t"), wireStr("x")), rcProtocolError},
		// [MQTT-3.3.2-14]: a response topic is a topic name, without wildcards.
		{"will response topic with a wildcard", 0, auditConnect5(wireClean|wireWill, auditProps(), "c",
			auditProps(auditProp(packets.PropResponseTopic, wireStr("reply/#")...)),
			wireStr("will/t"), wireStr("x")), rcProtocolError},
		// §2.2.2.2: a property cannot run past the property length. The
		// codec reads the session expiry's value from the client id
		// that follows, and takes the client id from inside it.
		{"property past the property length", 0, auditConnect5(wireClean, []byte{2, packets.PropSessionExpiryInterval, 0, 0, 0, 0}, "c"), rcMalformed},
		// §2.2.2.2: a property not valid for the packet type makes it
		// malformed; the codec enforces this one.
		{"server-only property", 0, auditConnect5(wireClean, auditProps(auditProp(packets.PropAssignedClientID, wireStr("x")...)), "c"), rcMalformed},
		// [MQTT-3.1.3-12] (5.0), [MQTT-3.1.3-11] (3.1.1): the user name
		// is a UTF-8 string [MQTT-1.5.4-1] [MQTT-1.5.4-2].
		{"user name not UTF-8", 0, auditConnect5(wireClean|wireUser, auditProps(), "c", wireStr("u\xff")), rcMalformed},
		{"user name with U+0000", 0, auditConnect5(wireClean|wireUser, auditProps(), "c", wireStr("u\x00")), rcMalformed},
		{"3.1.1 user name not UTF-8", 0, wireConnect(4, wireClean|wireUser, 0, "c", wireStr("u\xed\xa0\x80")), silent},
		// [MQTT-3.1.2-16] [MQTT-3.1.2-18] (5.0), [MQTT-3.1.2-18]
		// [MQTT-3.1.2-20] (3.1.1): no user name or password unless the
		// flags announce them, so nothing may follow the last field.
		{"bytes after the client id", 0, auditConnect5(wireClean, auditProps(), "c", wireStr("u")), rcMalformed},
		{"3.1.1 bytes after the client id", 0, wireConnect(4, wireClean, 0, "c", wireStr("u")), silent},
		{"3.1.1 bytes after the password", 0, wireConnect(4, wireClean|wireUser|wirePassword, 0, "c", wireStr("u"), wireStr("p"), []byte{0}), silent},
	})
}

// TestAuditPacketProperties sends packets after CONNECT whose properties
// break a rule the spec states: DISCONNECT with the reason code, then the
// end of the connection (§4.13).
func TestAuditPacketProperties(t *testing.T) {
	expiry := func(v uint32) []byte { return auditProp(packets.PropMessageExpiryInterval, auditU32(v)...) }
	subID := func(v byte) []byte { return auditProp(packets.PropSubscriptionIdentifier, v) }
	runMalformed(t, startMalformedBroker(t).Addr, []malformedCase{
		// §2.2.2.2, §3.3.2.3: each PUBLISH property at most once, but
		// the User Property.
		{"PUBLISH message expiry twice", 5, auditPublish5(0, "a", 0, auditProps(expiry(5), expiry(6)), "x"), rcProtocolError},
		{"PUBLISH payload format twice", 5, auditPublish5(2, "a", 1, auditProps(
			auditProp(packets.PropPayloadFormat, 0), auditProp(packets.PropPayloadFormat, 1)), "x"), rcProtocolError},
		{"PUBLISH topic alias twice", 5, auditPublish5(0, "a", 0, auditProps(
			auditProp(packets.PropTopicAlias, auditU16(1)...), auditProp(packets.PropTopicAlias, auditU16(2)...)), "x"), rcProtocolError},
		{"PUBLISH content type twice", 5, auditPublish5(0, "a", 0, auditProps(
			auditProp(packets.PropContentType, wireStr("a")...), auditProp(packets.PropContentType, wireStr("b")...)), "x"), rcProtocolError},
		{"PUBLISH correlation data twice", 5, auditPublish5(0, "a", 0, auditProps(
			auditProp(packets.PropCorrelationData, wireStr("a")...), auditProp(packets.PropCorrelationData, wireStr("b")...)), "x"), rcProtocolError},
		// [MQTT-3.3.2-14]: the codec would drop such a response topic
		// when forwarding, against [MQTT-3.3.2-15].
		{"PUBLISH response topic with a wildcard", 5, auditPublish5(0, "a", 0, auditProps(
			auditProp(packets.PropResponseTopic, wireStr("reply/+")...)), "x"), rcProtocolError},
		{"PUBLISH empty response topic", 5, auditPublish5(0, "a", 0, auditProps(
			auditProp(packets.PropResponseTopic, wireStr("")...)), "x"), rcProtocolError},
		// §2.2.2.2: the payload format's value is past the property
		// length; the codec takes it from the payload.
		{"PUBLISH property past the property length", 5, auditPublish5(0, "a", 0, []byte{1, packets.PropPayloadFormat}, "x"), rcMalformed},
		{"PUBLISH with a CONNECT property", 5, auditPublish5(0, "a", 0, auditProps(auditExpiry1), "x"), rcMalformed},
		// §3.8.2.1.2: one subscription identifier per SUBSCRIBE.
		{"SUBSCRIBE subscription identifier twice", 5, wireFrame(wireSUBSCRIBE, wireU16(1), auditProps(subID(1), subID(2)), wireStr("a"), []byte{0}), rcProtocolError},
		// §3.14.2.2: each DISCONNECT property at most once.
		{"DISCONNECT session expiry twice", 5, wireFrame(wireDISCONNECT, []byte{0}, auditProps(
			auditProp(packets.PropSessionExpiryInterval, auditU32(0)...), auditProp(packets.PropSessionExpiryInterval, auditU32(0)...))), rcProtocolError},
		// §3.4.2.2: the properties end the PUBACK.
		{"PUBACK bytes after the properties", 5, wireFrame(wirePUBACK, wireU16(1), []byte{0}, auditProps(), []byte{0}), rcMalformed},
		{"PUBREL reason string twice", 5, wireFrame(wirePUBREL, wireU16(1), []byte{0}, auditProps(
			auditProp(packets.PropReasonString, wireStr("a")...), auditProp(packets.PropReasonString, wireStr("b")...))), rcProtocolError},
		// §3.4.1 (3.1.1): a PUBACK's remaining length is 2.
		{"3.1.1 PUBACK with a third byte", 4, wireFrame(wirePUBACK, wireU16(1), []byte{0}), silent},
		{"3.1.1 PUBREL with a third byte", 4, wireFrame(wirePUBREL, wireU16(1), []byte{0}), silent},
	})
}

// TestAuditRepeatableProperties checks the other side of the rule: User
// Property may appear any number of times (§3.3.2.3.7), and its pairs go
// to the receiver in order [MQTT-3.3.2-18].
func TestAuditRepeatableProperties(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	sub, _ := connectRaw(t, tb.Addr, 5, "audit-rp-sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "rp/#"})
	w := wireDial(t, tb.Addr)
	w.send(auditConnect5(wireClean, auditProps(auditUserProp, auditUserProp), "audit-rp-pub"))
	w.expectConnack(5, 0, 0)
	two := auditProp(packets.PropUser, append(wireStr("k"), wireStr("w")...)...)
	w.send(auditPublish5(2, "rp/t", 1, auditProps(auditUserProp, two), "x"))
	w.expectType(wirePUBACK)
	m := sub.expectPublish("rp/t", "x", 0)
	if u := m.Properties.User; len(u) != 2 || u[0].Val != "v" || u[1].Val != "w" {
		t.Fatalf("user properties %v, want k=v then k=w [MQTT-3.3.2-18]", u)
	}
}

// auditFits fails the test if pk took more than limit bytes on the wire.
func auditFits(t *testing.T, pk *packets.Packet, limit int) {
	t.Helper()
	if n := 1 + len(mqttwire.AppendVarint(nil, pk.FixedHeader.Remaining)) + pk.FixedHeader.Remaining; n > limit {
		t.Fatalf("%s of %d bytes to a client that accepts %d", rawDescribe(pk), n, limit)
	}
}

// TestAuditReasonStringsFitMaximumPacketSize checks that a reason string
// gives way when it would take a packet past the Maximum Packet Size the
// client announced [MQTT-3.1.2-24]: the server leaves it out rather than
// send a packet the client cannot accept.
func TestAuditReasonStringsFitMaximumPacketSize(t *testing.T) {
	t.Parallel()

	t.Run("CONNACK", func(t *testing.T) {
		t.Parallel()
		// [MQTT-3.2.2-19].
		tb := startBroker(t, func(o *Options) { o.AllowAnonymous = false })
		c := dialRaw(t, tb.Addr, 5)
		pk := c.connectPacket("audit-mps-connack", true)
		pk.Properties.MaximumPacketSize = 16
		ack := c.connect(pk)
		if ack.ReasonCode != rcNotAuthorized {
			t.Fatalf("got %s, want reason 0x87", rawDescribe(ack))
		}
		auditFits(t, ack, 16)
	})

	t.Run("PUBACK", func(t *testing.T) {
		t.Parallel()
		// [MQTT-3.4.2-2].
		tb := startBroker(t, nil)
		c, _ := connectRaw(t, tb.Addr, 5, "audit-mps-puback", true, func(pk *packets.Packet) {
			pk.Properties.MaximumPacketSize = 32
		})
		c.send(rawPublish("$SYS/denied/"+strings.Repeat("x", 15), "x", 1, false, 1))
		ack := c.expectAck(packets.Puback, 1, rcNotAuthorized)
		auditFits(t, ack, 32)
	})

	t.Run("DISCONNECT", func(t *testing.T) {
		t.Parallel()
		// [MQTT-3.14.2-3]. The takeover reason string is 43 bytes, the
		// DISCONNECT carrying it 50; the codec's own check lets it
		// through for a limit of 48.
		tb := startBroker(t, nil)
		old, _ := connectRaw(t, tb.Addr, 5, "audit-mps-dis", true, func(pk *packets.Packet) {
			pk.Properties.MaximumPacketSize = 48
		})
		connectRaw(t, tb.Addr, 5, "audit-mps-dis", true, nil)
		auditFits(t, old.expectDisconnect(rcSessionTakenOver), 48)
	})
}
