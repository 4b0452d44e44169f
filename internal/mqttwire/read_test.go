package mqttwire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/mochi-mqtt/server/v2/packets"
)

func TestReadPacket(t *testing.T) {
	big := bytes.Repeat([]byte{'x'}, 200)
	cases := []struct {
		name  string
		in    []byte
		limit int
		typ   byte   // the type read, when no error
		body  []byte // the body read, when no error
		code  byte   // the *Error's reason code, 0 for none
		err   error  // the stream's error, nil for none
	}{
		{name: "PINGREQ", in: []byte{0xC0, 0}, typ: packets.Pingreq, body: []byte{}},
		{name: "PUBACK", in: []byte{0x40, 2, 0, 7}, typ: packets.Puback, body: []byte{0, 7}},
		{name: "two-byte length", in: append([]byte{0x30, 0xC8, 0x01}, big...), typ: packets.Publish, body: big},
		{name: "length in more bytes than needed", in: []byte{0x40, 0x82, 0x00, 0, 7}, typ: packets.Puback, body: []byte{0, 7}},
		{name: "exactly at the limit", in: []byte{0x40, 2, 0, 7}, limit: 4, typ: packets.Puback, body: []byte{0, 7}},

		// [MQTT-2.1.3-1]: reserved flags must be as the type says.
		{name: "CONNECT with flags", in: []byte{0x11, 0}, code: 0x81},
		{name: "PUBREL without its flags", in: []byte{0x60, 2, 0, 1}, code: 0x81},
		{name: "SUBSCRIBE without its flags", in: []byte{0x80, 0}, code: 0x81},
		{name: "PUBLISH of QoS 3", in: []byte{0x36, 0}, code: 0x81}, // [MQTT-3.3.1-4]
		// [MQTT-1.5.5-1]: at most four length bytes.
		{name: "five-byte length", in: []byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x00}, code: 0x81},
		{name: "length above 268435455", in: []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, code: 0x81},
		// [MQTT-3.2.2-15]: larger than the reader takes.
		{name: "one byte over the limit", in: []byte{0x40, 2, 0, 7}, limit: 3, code: 0x95},
		{name: "announcing 268435455 bytes", in: []byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0, 1, 'a'}, limit: 1 << 20, code: 0x95},

		{name: "nothing", in: nil, err: io.EOF},
		{name: "header byte only", in: []byte{0x30}, err: io.ErrUnexpectedEOF},
		{name: "length cut", in: []byte{0x30, 0xFF, 0xFF}, err: io.ErrUnexpectedEOF},
		{name: "body cut", in: []byte{0x40, 2, 0}, err: io.ErrUnexpectedEOF},
		{name: "largest length, no body", in: []byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0, 1, 'a'}, err: io.ErrUnexpectedEOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := bufio.NewReader(iotest.OneByteReader(bytes.NewReader(tc.in)))
			fh, body, err := ReadPacket(r, tc.limit, nil)
			var we *Error
			switch {
			case tc.code != 0:
				if !errors.As(err, &we) || we.Code != tc.code {
					t.Fatalf("err %v, want an *Error with code 0x%02X", err, tc.code)
				}
			case tc.err != nil:
				if !errors.Is(err, tc.err) || errors.As(err, &we) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
			case err != nil:
				t.Fatalf("err %v", err)
			case fh.Type != tc.typ || fh.Remaining != len(tc.body) || !bytes.Equal(body, tc.body):
				t.Fatalf("read type %d remaining %d body % X, want type %d body % X", fh.Type, fh.Remaining, body, tc.typ, tc.body)
			}
		})
	}
}

// TestReadPacketInSequence: packets back to back come off one by one, and
// the end of the stream between them is io.EOF.
func TestReadPacketInSequence(t *testing.T) {
	stream := []byte{0x30, 3, 0, 1, 'a', 0x62, 2, 0, 9, 0xD0, 0}
	r := bufio.NewReader(bytes.NewReader(stream))
	for _, want := range []byte{packets.Publish, packets.Pubrel, packets.Pingresp} {
		fh, _, err := ReadPacket(r, 0, nil)
		if err != nil || fh.Type != want {
			t.Fatalf("read type %d, %v; want type %d", fh.Type, err, want)
		}
	}
	if _, _, err := ReadPacket(r, 0, nil); err != io.EOF {
		t.Fatalf("after the last packet: %v, want io.EOF", err)
	}
}

func TestReadHeaderSize(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		size int
	}{
		{[]byte{0}, 2},
		{[]byte{0x7F}, 2 + 0x7F},
		{[]byte{0x80, 0x01}, 3 + 128},
		{[]byte{0x80, 0x00}, 3}, // more bytes than needed count as sent
		{[]byte{0xFF, 0xFF, 0xFF, 0x7F}, MaxPacket},
	} {
		fh, size, err := ReadHeader(0x30, bytes.NewReader(tc.in), 0)
		if err != nil || size != tc.size || fh.Remaining != size-1-len(tc.in) {
			t.Errorf("% X: size %d remaining %d, %v; want size %d", tc.in, size, fh.Remaining, err, tc.size)
		}
	}
}

// TestReadHeaderStreamError: an error of the stream is not the packet's.
func TestReadHeaderStreamError(t *testing.T) {
	_, _, err := ReadHeader(0x30, bufio.NewReader(iotest.TimeoutReader(bytes.NewReader([]byte{0x80}))), 0)
	var we *Error
	if !errors.Is(err, iotest.ErrTimeout) || errors.As(err, &we) {
		t.Fatalf("err %v, want the stream's timeout", err)
	}
}

func TestReadBodyGrowsAsBytesArrive(t *testing.T) {
	for _, n := range []int{0, 1, bodyChunk - 1, bodyChunk, bodyChunk + 1, 5*bodyChunk + 3} {
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(i * 7)
		}
		got, err := ReadBody(iotest.HalfReader(bytes.NewReader(want)), n, nil)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("n=%d: err %v, equal %v", n, err, bytes.Equal(got, want))
		}
		if n > 0 {
			if _, err := ReadBody(bytes.NewReader(want[:n-1]), n, nil); err == nil {
				t.Fatalf("n=%d: a short body read without error", n)
			}
		}
	}
}

// TestReadBodyHoldsOnlyWhatArrived: a body announced large but cut short
// never had room for more than twice what arrived.
func TestReadBodyHoldsOnlyWhatArrived(t *testing.T) {
	sent := make([]byte, 3*bodyChunk)
	r := &capturing{r: bytes.NewReader(sent)}
	if _, err := ReadBody(r, MaxRemaining, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v, want io.ErrUnexpectedEOF", err)
	}
	if r.largest > 2*len(sent) {
		t.Fatalf("a read into %d bytes for %d sent", r.largest, len(sent))
	}
}

// capturing records the largest buffer a read was offered.
type capturing struct {
	r       io.Reader
	largest int
}

func (c *capturing) Read(p []byte) (int, error) {
	c.largest = max(c.largest, len(p))
	return c.r.Read(p)
}

// TestReadBodyReusesBuffer: a buffer large enough is read into, without
// an allocation; a small one is replaced.
func TestReadBodyReusesBuffer(t *testing.T) {
	want := bytes.Repeat([]byte("abc"), 100)
	buf := make([]byte, 0, 512)
	src := bytes.NewReader(want)
	allocs := testing.AllocsPerRun(100, func() {
		src.Reset(want)
		got, err := ReadBody(src, len(want), buf)
		if err != nil || !bytes.Equal(got, want) || &got[0] != &buf[:1][0] {
			t.Fatalf("err %v, equal %v, in buf %v", err, bytes.Equal(got, want), &got[0] == &buf[:1][0])
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations reading into a large enough buffer", allocs)
	}
	small := make([]byte, 0, 8)
	got, err := ReadBody(bytes.NewReader(want), len(want), small)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("into a small buffer: err %v, equal %v", err, bytes.Equal(got, want))
	}
}

func TestErrorText(t *testing.T) {
	err := Errorf(0x95, "packet of %d bytes", 9)
	if got, want := err.Error(), "packet of 9 bytes (reason 0x95)"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
