package mqttwire

import (
	"bufio"
	"bytes"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// codecAck is an acknowledgement as the codec encodes it: the oracle for
// the codes it encodes faithfully (it drops a reason code below 0x80 that
// has no properties, which the spec allows only for 0x00 [MQTT-3.4.2-1]).
func codecAck(t *testing.T, kind byte, pid uint16, code byte, v5 bool, reason string) []byte {
	t.Helper()
	pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: kind}, PacketID: pid, ReasonCode: code, ProtocolVersion: 4}
	if v5 {
		pk.ProtocolVersion = 5
		pk.Properties.ReasonString = reason
	}
	b, err := Encode(pk)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAckMatchesCodec(t *testing.T) {
	for _, kind := range []byte{packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp} {
		for _, v5 := range []bool{false, true} {
			for _, code := range []byte{0x00, 0x80, 0x87, 0x92, 0x97} {
				for _, reason := range []string{"", "not authorized to publish to a/b", strings.Repeat("r", 300)} {
					want := codecAck(t, kind, 0x1234, code, v5, reason)
					if !v5 {
						// 3.1.1 has no reason code: the codec is asked for none.
						want = codecAck(t, kind, 0x1234, 0, false, "")
					}
					got := Ack(kind, 0x1234, code, v5, reason)
					if !bytes.Equal(got, want) {
						t.Errorf("%s v5=%v code 0x%02X reason %d bytes: % X, codec % X", PacketName(kind), v5, code, len(reason), got, want)
					}
					if cap(got) != len(got) {
						t.Errorf("%s: %d bytes in a slice of %d", PacketName(kind), len(got), cap(got))
					}
					if app := AppendAck([]byte{9}, kind, 0x1234, code, v5, reason); !bytes.Equal(app[1:], want) || app[0] != 9 {
						t.Errorf("AppendAck % X, want 09 % X", app, want)
					}
				}
			}
		}
	}
}

func TestAckForms(t *testing.T) {
	for _, tc := range []struct {
		name   string
		kind   byte
		code   byte
		v5     bool
		reason string
		want   []byte
	}{
		{"3.1.1 PUBACK", packets.Puback, 0, false, "", []byte{0x40, 2, 0, 5}},
		{"3.1.1 ignores the code", packets.Pubrec, 0x87, false, "no", []byte{0x50, 2, 0, 5}},
		{"PUBREL flags", packets.Pubrel, 0, true, "", []byte{0x62, 2, 0, 5}},
		{"success is short", packets.Pubcomp, 0, true, "", []byte{0x70, 2, 0, 5}},
		{"a code below 0x80 stays", packets.Puback, 0x10, true, "", []byte{0x40, 3, 0, 5, 0x10}},
		{"a failure code", packets.Pubrel, 0x92, true, "", []byte{0x62, 3, 0, 5, 0x92}},
		{"a reason string", packets.Puback, 0x87, true, "no", []byte{0x40, 9, 0, 5, 0x87, 5, 0x1F, 0, 2, 'n', 'o'}},
		{"a reason string too long is left out", packets.Puback, 0x87, true, strings.Repeat("x", 0x10000), []byte{0x40, 3, 0, 5, 0x87}},
	} {
		if got := Ack(tc.kind, 5, tc.code, tc.v5, tc.reason); !bytes.Equal(got, tc.want) {
			t.Errorf("%s: % X, want % X", tc.name, got, tc.want)
		}
	}
}

// TestAckAllocations: the common acknowledgement costs one allocation of
// its four bytes, and none appended to room that is there.
func TestAckAllocations(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = Ack(packets.Puback, 1, 0, true, "") }); n != 1 {
		t.Errorf("Ack: %v allocations", n)
	}
	var room [4]byte
	if n := testing.AllocsPerRun(100, func() { _ = AppendAck(room[:0], packets.Puback, 1, 0, true, "") }); n != 0 {
		t.Errorf("AppendAck: %v allocations", n)
	}
}

// TestEncodeRoundTrip: every packet type encodes, reads back through
// ReadPacket and decodes to what was encoded, at both versions.
func TestEncodeRoundTrip(t *testing.T) {
	for _, v := range []byte{4, 5} {
		for _, pk := range []*packets.Packet{
			{FixedHeader: packets.FixedHeader{Type: packets.Connect}, Connect: packets.ConnectParams{ProtocolName: []byte("MQTT"), ClientIdentifier: "c1", Clean: true, Keepalive: 30}},
			{FixedHeader: packets.FixedHeader{Type: packets.Connack}, SessionPresent: true},
			{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true}, TopicName: "a/b", PacketID: 7, Payload: []byte("hello")},
			{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: 7},
			{FixedHeader: packets.FixedHeader{Type: packets.Pubrec}, PacketID: 8},
			{FixedHeader: packets.FixedHeader{Type: packets.Pubrel}, PacketID: 8},
			{FixedHeader: packets.FixedHeader{Type: packets.Pubcomp}, PacketID: 8},
			{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 9, Filters: packets.Subscriptions{{Filter: "a/+", Qos: 1}}},
			{FixedHeader: packets.FixedHeader{Type: packets.Suback}, PacketID: 9, ReasonCodes: []byte{1}},
			{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe}, PacketID: 10, Filters: packets.Subscriptions{{Filter: "a/+"}}},
			{FixedHeader: packets.FixedHeader{Type: packets.Unsuback}, PacketID: 10},
			{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}},
			{FixedHeader: packets.FixedHeader{Type: packets.Pingresp}},
			{FixedHeader: packets.FixedHeader{Type: packets.Disconnect}},
		} {
			pk.ProtocolVersion = v
			name := PacketName(pk.FixedHeader.Type)
			b, err := Encode(pk)
			if err != nil {
				t.Fatalf("v%d %s: %v", v, name, err)
			}
			fh, body, err := ReadPacket(bufio.NewReader(bytes.NewReader(b)), 0, nil)
			if err != nil {
				t.Fatalf("v%d %s: % X reads back as %v", v, name, b, err)
			}
			got := &packets.Packet{FixedHeader: fh, ProtocolVersion: v}
			if err := Decode(got, body); err != nil {
				t.Fatalf("v%d %s: % X decodes as %v", v, name, b, err)
			}
			if got.FixedHeader != pk.FixedHeader || got.PacketID != pk.PacketID || got.TopicName != pk.TopicName ||
				!bytes.Equal(got.Payload, pk.Payload) || len(got.Filters) != len(pk.Filters) || got.SessionPresent != pk.SessionPresent ||
				got.Connect.ClientIdentifier != pk.Connect.ClientIdentifier {
				t.Errorf("v%d %s: decoded %+v, encoded %+v", v, name, got, pk)
			}
		}
	}
}

// TestEncodeSetsRequiredFlags: PUBREL, SUBSCRIBE and UNSUBSCRIBE carry
// flags 0010 whatever the caller left in the header.
func TestEncodeSetsRequiredFlags(t *testing.T) {
	for _, kind := range []byte{packets.Pubrel, packets.Subscribe, packets.Unsubscribe} {
		pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: kind}, PacketID: 1, ProtocolVersion: 4,
			Filters: packets.Subscriptions{{Filter: "a"}}}
		b, err := Encode(pk)
		if err != nil || b[0] != kind<<4|0x02 {
			t.Errorf("%s: first byte % X, %v; want %02X", PacketName(kind), b[:1], err, kind<<4|0x02)
		}
	}
}

func TestEncodeErrors(t *testing.T) {
	for name, pk := range map[string]*packets.Packet{
		"no such type":             {FixedHeader: packets.FixedHeader{Type: 0}},
		"QoS 1 without identifier": {FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "a", ProtocolVersion: 4},
	} {
		if b, err := Encode(pk); err == nil {
			t.Errorf("%s: encoded % X", name, b)
		}
	}
}
