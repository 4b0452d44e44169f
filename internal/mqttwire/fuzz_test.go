package mqttwire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// FuzzReadPacket reads packets off arbitrary bytes until the stream ends
// or a packet is refused, and decodes each at both protocol versions. The
// reader must not panic, must take exactly the bytes a packet's header
// announces, must refuse only with an *Error of a code it documents, and
// a packet's framing must read back from AppendHeader; Decode must turn
// every decoder failure, panics included, into an *Error.
//
//	go test -run XXX -fuzz FuzzReadPacket -fuzztime 30s ./internal/mqttwire
func FuzzReadPacket(f *testing.F) {
	for _, seed := range [][]byte{
		{0xC0, 0},
		{0x10, 16, 0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 30, 0, 0, 3, 'a', 'b', 'c'},
		{0x32, 9, 0, 3, 'a', '/', 'b', 0, 1, 'h', 'i', 0x62, 2, 0, 1},
		{0x82, 6, 0, 1, 0, 0, 1, 'a'},
		{0x40, 0x82, 0x00, 0, 7},
		{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0, 1, 'a'},
		{0xC0, 0x80, 0x80, 0x80, 0x80, 0x00},
		{0xE0, 1, 0x8E, 0xE0, 3, 0x04, 1, 0},
	} {
		f.Add(seed)
	}
	const limit = 1 << 10 // small, so that the fuzzer reaches it
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		var buf []byte
		for off := 0; ; {
			fh, body, err := ReadPacket(r, limit, buf)
			var we *Error
			switch {
			case errors.As(err, &we):
				if we.Code != codeMalformed && we.Code != codePacketLarge {
					t.Fatalf("refused with code 0x%02X: %v", we.Code, err)
				}
				return
			case err == io.EOF:
				if off != len(data) {
					t.Fatalf("io.EOF at %d of %d bytes", off, len(data))
				}
				return
			case err == io.ErrUnexpectedEOF:
				return
			case err != nil:
				t.Fatalf("error of neither the packet nor the stream's end: %v", err)
			}
			if fh.Remaining != len(body) {
				t.Fatalf("remaining %d, body %d bytes", fh.Remaining, len(body))
			}
			_, lenBytes, _ := Varint(data[off+1:])
			size := 1 + lenBytes + len(body)
			if size > limit || !bytes.Equal(data[off+1+lenBytes:off+size], body) {
				t.Fatalf("packet at %d: %d bytes, body % X", off, size, body)
			}
			if lenBytes == varintLen(len(body)) {
				if framed := append(AppendHeader(nil, data[off], len(body)), body...); !bytes.Equal(framed, data[off:off+size]) {
					t.Fatalf("AppendHeader frames % X, read % X", framed, data[off:off+size])
				}
			}
			off += size
			for _, v := range []byte{4, 5} {
				pk := &packets.Packet{FixedHeader: fh, ProtocolVersion: v}
				if err := Decode(pk, bytes.Clone(body)); err != nil && !errors.As(err, &we) {
					t.Fatalf("Decode: %v is not an *Error", err)
				}
			}
			buf = body
		}
	})
}
