package mqttwire

import (
	"bytes"
	"fmt"

	"github.com/mochi-mqtt/server/v2/packets"
)

// AppendHeader appends a fixed header: the first byte hb (type and flags)
// and the remaining length, the size of the body that must follow.
func AppendHeader(dst []byte, hb byte, remaining int) []byte {
	return AppendVarint(append(dst, hb), remaining)
}

// Ack returns a PUBACK, PUBREC, PUBREL or PUBCOMP (kind) for packet
// identifier pid, in a slice of its own and of its exact size; see
// AppendAck.
func Ack(kind byte, pid uint16, code byte, v5 bool, reason string) []byte {
	return AppendAck(make([]byte, 0, ackLen(code, v5, reason)), kind, pid, code, v5, reason)
}

// AppendAck appends a PUBACK, PUBREC, PUBREL or PUBCOMP (kind) for packet
// identifier pid. In MQTT 5 it carries reason code code and, when reason
// is not empty, a Reason String property; success without a reason string
// is the four-byte form both versions share [MQTT-3.4.2-1], and MQTT 3.1.1
// has neither. A reason string longer than a string can be (65,535 bytes)
// is left out, as a sender may [MQTT-3.4.2-2]. PUBREL gets the flags it
// must carry [MQTT-3.6.1-1].
func AppendAck(dst []byte, kind byte, pid uint16, code byte, v5 bool, reason string) []byte {
	h := kind << 4
	if kind == packets.Pubrel {
		h |= 0x02 // [MQTT-3.6.1-1]
	}
	if len(reason) > MaxString {
		reason = ""
	}
	switch {
	case !v5 || code == 0 && reason == "":
		return append(dst, h, 2, byte(pid>>8), byte(pid))
	case reason == "":
		return append(dst, h, 3, byte(pid>>8), byte(pid), code)
	}
	props := 3 + len(reason) // identifier, two-byte length, text
	dst = AppendHeader(dst, h, 3+varintLen(props)+props)
	dst = append(dst, byte(pid>>8), byte(pid), code)
	dst = AppendVarint(dst, props)
	dst = append(dst, packets.PropReasonString, byte(len(reason)>>8), byte(len(reason)))
	return append(dst, reason...)
}

// ackLen is the size of the acknowledgement AppendAck appends.
func ackLen(code byte, v5 bool, reason string) int {
	if len(reason) > MaxString {
		reason = ""
	}
	switch {
	case !v5 || code == 0 && reason == "":
		return 4
	case reason == "":
		return 5
	}
	props := 3 + len(reason)
	rem := 3 + varintLen(props) + props
	return 1 + varintLen(rem) + rem
}

// Encode returns pk encoded by the codec's encoder for its type, in a
// slice of its own; see EncodeTo.
func Encode(pk *packets.Packet) ([]byte, error) {
	var buf bytes.Buffer
	if err := EncodeTo(&buf, pk); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// EncodeTo writes pk to buf with the codec's encoder for its type, at
// pk.ProtocolVersion. PUBREL, SUBSCRIBE and UNSUBSCRIBE get the header
// flags they must carry [MQTT-3.6.1-1] [MQTT-3.8.1-1] [MQTT-3.10.1-1];
// the codec sets pk.FixedHeader.Remaining. The error is the codec's, for
// a packet it will not encode (a QoS 1 PUBLISH without a packet
// identifier, say), or a type that does not exist.
func EncodeTo(buf *bytes.Buffer, pk *packets.Packet) error {
	t := pk.FixedHeader.Type
	c := codecFor(t)
	if c == nil {
		return fmt.Errorf("mqttwire: no packet of type %d", t)
	}
	switch t {
	case packets.Pubrel, packets.Subscribe, packets.Unsubscribe:
		pk.FixedHeader.Qos = 1
	}
	return c.encode(pk, buf)
}
