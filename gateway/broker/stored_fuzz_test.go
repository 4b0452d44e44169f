package broker

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
	"github.com/mochi-mqtt/server/v2/packets"
)

// FuzzStoredMessage restores a message from what storage hands back after
// a restart, as restore does: storage checks its own framing, but the
// MQTT 5 properties inside are opaque bytes to it, and a damaged file can
// hold anything there. Restoring must fail with an error or succeed, never
// panic; a restored message must encode, at every QoS and in both
// protocol versions, into a PUBLISH that decodes to the same topic and
// payload and to the properties it keeps when stored again; and those
// must not drift from one restart to the next.
//
//	go test -run '^$' -fuzz FuzzStoredMessage -fuzztime 15s ./gateway/broker
func FuzzStoredMessage(f *testing.F) {
	encodeProps := func(p *packets.Properties) []byte {
		var buf bytes.Buffer
		p.Encode(packets.Publish, packets.Mods{AllowResponseInfo: true}, &buf, 0)
		return buf.Bytes()
	}
	f.Add("plant/a/temp", []byte("21.5"), []byte(nil), byte(1), false, int64(0))
	f.Add("a", []byte{}, encodeProps(&packets.Properties{
		PayloadFormat: 1, PayloadFormatFlag: true, ContentType: "text/plain", ResponseTopic: "r/1",
		CorrelationData: []byte{1, 2}, User: []packets.UserProperty{{Key: "k", Val: "v"}, {Key: "k", Val: "w"}},
	}), byte(2), true, time.Now().Add(time.Hour).UnixNano())
	f.Add("a/b", []byte("x"), encodeProps(&packets.Properties{MessageExpiryInterval: 60}), byte(0), false, int64(1))
	f.Add("t", []byte("x"), []byte{5, 0x26, 0, 1, 'k', 0}, byte(1), false, int64(0)) // a user property cut short
	f.Add("t", []byte("x"), []byte{2, 0x0B, 0x80}, byte(1), false, int64(0))         // a subscription identifier cut short
	f.Add("t", []byte("x"), []byte{0x80, 0x80, 0x80, 0x80, 0x01}, byte(1), false, int64(0))
	f.Add("t", []byte("x"), []byte{3, 0x11, 0, 0}, byte(1), false, int64(0)) // a CONNECT property
	// A response topic with a wildcard, which the codec drops when it
	// encodes: the stored form changes once, then stays.
	f.Add("0", []byte("0"), []byte(" \x010\x03\x00\n0000000000\b\x00\x030#0#00\x010&\x00\x010\x00\x0100000000"), byte(2), true, int64(1796000323231262780))
	f.Fuzz(func(t *testing.T, topic string, payload, props []byte, qos byte, retain bool, expiry int64) {
		sm := &storage.Message{Topic: topic, Payload: payload, Props: props, QoS: qos % 3, Retain: retain, Expiry: expiry}
		m, err := messageFromStored(sm)
		// A will's properties are decoded as restore does it.
		var wp packets.Properties
		if len(props) > 0 {
			_, _ = wp.Decode(packets.WillProperties, bytes.NewBuffer(bytes.Clone(props)))
			w := &will{topic: topic, payload: payload, qos: qos % 3, retain: retain, props: &wp}
			_ = w.message(time.Now())
		}
		if err != nil {
			return
		}
		if m.topic != topic || !bytes.Equal(m.payload, payload) || m.qos != qos%3 || m.retain != retain || m.expiry != expiry {
			t.Fatalf("restored %+v from %+v", m, sm)
		}
		// Stored again, it restores to what the codec keeps of it (the
		// codec drops what it will not send, such as a response topic
		// with a wildcard), and from then on to the same at every restart.
		again, err := messageFromStored(storedMessage(m))
		if err != nil {
			t.Fatalf("the stored form of a restored message does not restore: %v", err)
		}
		third, err := messageFromStored(storedMessage(again))
		if err != nil {
			t.Fatalf("the stored form of a twice restored message does not restore: %v", err)
		}
		if !reflect.DeepEqual(fuzzComparable(third.props), fuzzComparable(again.props)) {
			t.Fatalf("properties drift across restarts: %+v became %+v", again.props, third.props)
		}
		if matcher.ValidateTopic(topic) != nil || len(topic) > 0xFFFF {
			return // not a topic the broker could have stored
		}
		for _, v5 := range []bool{false, true} {
			for q := range byte(3) {
				wire := m.encoded(v5, q, retain)
				pk, err := fuzzDecodePublish(wire, v5)
				if err != nil {
					t.Fatalf("v5=%v QoS %d: the encoding % X does not decode: %v", v5, q, wire, err)
				}
				if pk.TopicName != topic || !bytes.Equal(pk.Payload, payload) || pk.FixedHeader.Qos != q || pk.FixedHeader.Retain != retain {
					t.Fatalf("v5=%v QoS %d: %q % X decoded as %q % X", v5, q, topic, payload, pk.TopicName, pk.Payload)
				}
				if !v5 {
					continue
				}
				got := passThrough(&pk.Properties)
				if !reflect.DeepEqual(fuzzComparable(got), fuzzComparable(again.props)) {
					t.Fatalf("QoS %d: properties %+v went out as %+v", q, again.props, got)
				}
				if m.expiry != 0 && pk.Properties.MessageExpiryInterval == 0 {
					t.Fatalf("QoS %d: a message that expires went out without an expiry interval", q)
				}
			}
		}
	})
}

// fuzzDecodePublish decodes an encoded PUBLISH with the codec.
func fuzzDecodePublish(wire []byte, v5 bool) (*packets.Packet, error) {
	pk := &packets.Packet{ProtocolVersion: 4}
	if v5 {
		pk.ProtocolVersion = 5
	}
	if err := pk.FixedHeader.Decode(wire[0]); err != nil {
		return nil, err
	}
	n, size, ok := mqttwire.Varint(wire[1:])
	if !ok || 1+size+n != len(wire) {
		return nil, errRemaining
	}
	pk.FixedHeader.Remaining = n
	return pk, decode(pk, wire[1+size:])
}

var errRemaining = failure(rcMalformed, "remaining length does not match the packet")

// fuzzComparable normalises properties for comparison: nil and empty
// slices are the same on the wire.
func fuzzComparable(p *packets.Properties) *packets.Properties {
	if p == nil {
		return nil
	}
	c := *p
	if len(c.CorrelationData) == 0 {
		c.CorrelationData = nil
	}
	if len(c.User) == 0 {
		c.User = nil
	}
	return &c
}
