package mqttwire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/mochi-mqtt/server/v2/packets"
)

// bodyChunk is the most a packet body gets before its bytes arrive: a
// peer announcing a large packet and sending it slowly (or never) pins
// only what it has sent, not the size it announced.
const bodyChunk = 16 << 10

// Error is a packet that breaks the protocol: the MQTT 5 reason code
// (§2.4) the connection ends with, and what was wrong. A reader returns it
// for a packet it refuses; a peer answers it, in MQTT 5, with a DISCONNECT
// (or CONNACK) of that code.
type Error struct {
	Code   byte
	Reason string
}

func (e *Error) Error() string { return fmt.Sprintf("%s (reason 0x%02X)", e.Reason, e.Code) }

// Errorf returns an *Error with reason code code and a formatted reason.
func Errorf(code byte, format string, args ...any) error {
	return &Error{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// Reason codes the reader ends a connection with (MQTT 5 §2.4).
const (
	codeMalformed   = 0x81
	codePacketLarge = 0x95
)

// errLengthTooLong is a remaining length with a fifth byte: a malformed
// packet, where any other error of readLength is the stream's.
var errLengthTooLong = errors.New("remaining length longer than four bytes")

// ReadPacket reads one packet from r: its fixed header and body. limit is
// the largest packet accepted, in bytes, or 0 for MaxPacket. The body is
// read into buf's storage when buf is large enough, into a fresh slice
// otherwise (buf nil: always fresh); the codec's strings point into it and
// a PUBLISH keeps it as its payload, so a caller that passes buf again
// gives up the packet it read before. The stream ending before the first
// byte is io.EOF, inside a packet io.ErrUnexpectedEOF.
func ReadPacket(r *bufio.Reader, limit int, buf []byte) (packets.FixedHeader, []byte, error) {
	hb, err := r.ReadByte()
	if err != nil {
		return packets.FixedHeader{}, nil, err
	}
	fh, _, err := ReadHeader(hb, r, limit)
	if err != nil {
		return fh, nil, err
	}
	body, err := ReadBody(r, fh.Remaining, buf)
	return fh, body, err
}

// ReadHeader decodes a packet's first byte hb, which the caller has read,
// and reads its remaining length from r. It returns the fixed header, with
// Remaining set, and the packet's size on the wire. hb with reserved flags
// set [MQTT-2.1.3-1] (or a PUBLISH of QoS 3 [MQTT-3.3.1-4]) and a length
// of more than four bytes are Malformed Packets; a packet larger than
// limit (0 for MaxPacket) is Packet Too Large [MQTT-3.2.2-15].
func ReadHeader(hb byte, r io.ByteReader, limit int) (packets.FixedHeader, int, error) {
	var fh packets.FixedHeader
	if err := fh.Decode(hb); err != nil {
		return fh, 0, Errorf(codeMalformed, "bad fixed header flags 0x%02X", hb)
	}
	n, lenBytes, err := readLength(r)
	switch {
	case errors.Is(err, io.EOF):
		return fh, 0, io.ErrUnexpectedEOF
	case errors.Is(err, errLengthTooLong):
		return fh, 0, Errorf(codeMalformed, "bad remaining length")
	case err != nil:
		// A reset or a deadline: the stream failed, not the packet.
		return fh, 0, err
	}
	if limit <= 0 {
		limit = MaxPacket
	}
	size := 1 + lenBytes + n
	if size > limit {
		return fh, 0, Errorf(codePacketLarge, "packet of %d bytes is larger than the maximum %d", size, limit)
	}
	fh.Remaining = n
	return fh, size, nil
}

// readLength reads a remaining length and the bytes it took. The codec's
// decoder takes a fifth byte when the first four carry nothing, and any
// number of 0x80 bytes; the length is at most four bytes [MQTT-1.5.5-1]
// (3.1.1 §2.2.3).
func readLength(r io.ByteReader) (n, size int, err error) {
	mult := 1
	for size < 4 {
		b, err := r.ReadByte()
		if err != nil {
			return 0, size + 1, err
		}
		size++
		n += int(b&0x7f) * mult
		if b&0x80 == 0 {
			return n, size, nil
		}
		mult *= 128
	}
	return 0, size, errLengthTooLong
}

// ReadBody reads an n-byte packet body from r into buf's storage when it
// holds at least min(n, 16 KiB), into a fresh slice otherwise, and grows
// it as bytes arrive rather than to n at once. The stream ending first is
// io.ErrUnexpectedEOF.
func ReadBody(r io.Reader, n int, buf []byte) ([]byte, error) {
	var body []byte
	if buf == nil || cap(buf) < min(n, bodyChunk) {
		body = make([]byte, 0, min(n, bodyChunk))
	} else {
		body = buf[:0]
	}
	for len(body) < n {
		if len(body) == cap(body) {
			body = slices.Grow(body, min(n, 2*cap(body))-len(body))
		}
		m, err := io.ReadAtLeast(r, body[len(body):min(cap(body), n)], 1)
		body = body[:len(body)+m]
		if err != nil && len(body) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	return body, nil
}
