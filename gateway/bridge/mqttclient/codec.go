package mqttclient

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/mochi-mqtt/server/v2/packets"
)

// maxPacket is the largest packet MQTT can frame: a four-byte remaining
// length of 268,435,455 plus the header (§1.5.5).
const maxPacket = 1 + 4 + 268435455

// publishIDOffset returns where the packet id sits in an encoded PUBLISH:
// after the fixed header and the topic.
func publishIDOffset(b []byte, topic string) int {
	i := 1
	for b[i]&0x80 != 0 {
		i++
	}
	return i + 1 + 2 + len(topic)
}

// readPacket reads one packet: the fixed header and a fresh body, which the
// decoded packet's strings and payload point into. limit bounds the packet
// size, 0 for MQTT's own limit.
func readPacket(r *bufio.Reader, limit int) (packets.FixedHeader, []byte, error) {
	var fh packets.FixedHeader
	hb, err := r.ReadByte()
	if err != nil {
		return fh, nil, err
	}
	if err := fh.Decode(hb); err != nil {
		return fh, nil, protoErr(0x81, "fixed header 0x%02X: %v", hb, err)
	}
	n, lenBytes := 0, 0
	for shift := 0; ; shift += 7 {
		if lenBytes == 4 {
			return fh, nil, protoErr(0x81, "remaining length of more than four bytes") // §1.5.5
		}
		b, err := r.ReadByte()
		if err != nil {
			return fh, nil, unexpectedEOF(err)
		}
		lenBytes++
		n |= int(b&0x7F) << shift
		if b&0x80 == 0 {
			break
		}
	}
	if limit == 0 {
		limit = maxPacket
	}
	if 1+lenBytes+n > limit {
		return fh, nil, protoErr(0x95, "packet of %d bytes, above %d", 1+lenBytes+n, limit)
	}
	fh.Remaining = n
	// Grown as bytes arrive, so a length the server announces but never
	// sends costs nothing.
	body := make([]byte, 0, min(n, readBufSize))
	for len(body) < n {
		if len(body) == cap(body) {
			body = slices.Grow(body, min(n-len(body), cap(body)))
		}
		m, err := r.Read(body[len(body):min(cap(body), n)])
		body = body[:len(body)+m]
		if err != nil && len(body) < n {
			return fh, nil, unexpectedEOF(err)
		}
	}
	return fh, body, nil
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// decode runs a codec decoder under recover: the codec panics on some
// truncated inputs, and a bad packet from the server must end the
// connection, not the gateway.
func decode(pk *packets.Packet, body []byte, fn func(*packets.Packet, []byte) error) (err error) {
	name := strings.ToUpper(packetName(pk.FixedHeader.Type))
	defer func() {
		if r := recover(); r != nil {
			err = protoErr(0x81, "malformed %s", name)
		}
	}()
	if err := fn(pk, body); err != nil {
		return protoErr(0x81, "malformed %s: %v", name, err)
	}
	return nil
}

// encode runs a codec encoder into a fresh slice.
func encode(pk *packets.Packet, fn func(*packets.Packet, *bytes.Buffer) error) []byte {
	var buf bytes.Buffer
	_ = fn(pk, &buf) // errors only for a missing packet id, which we always set
	return buf.Bytes()
}

// ackPacket encodes PUBACK, PUBREC, PUBREL or PUBCOMP. Success without
// properties is the short form both versions share [MQTT-3.4.2-1].
func ackPacket(kind byte, pid uint16, code byte, v5 bool) []byte {
	h := kind << 4
	if kind == packets.Pubrel {
		h |= 0x02 // [MQTT-3.6.1-1]
	}
	if code == 0 || !v5 {
		return []byte{h, 2, byte(pid >> 8), byte(pid)}
	}
	return []byte{h, 3, byte(pid >> 8), byte(pid), code}
}

func packetName(t byte) string {
	if name, ok := packets.PacketNames[t]; ok {
		return name
	}
	return fmt.Sprintf("packet type %d", t)
}

func versionName(v byte) string {
	if v == 4 {
		return "MQTT 3.1.1"
	}
	return "MQTT 5"
}
