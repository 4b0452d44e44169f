package mqttwire

import (
	"bytes"
	"testing"
)

func TestVarint(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		n    int
		size int
		ok   bool
	}{
		{[]byte{0}, 0, 1, true},
		{[]byte{0x7F, 0xFF}, 127, 1, true},
		{[]byte{0x80, 0x01}, 128, 2, true},
		{[]byte{0xFF, 0x7F}, 16383, 2, true},
		{[]byte{0x80, 0x80, 0x01}, 16384, 3, true},
		{[]byte{0xFF, 0xFF, 0x7F}, 2097151, 3, true},
		{[]byte{0x80, 0x80, 0x80, 0x01}, 2097152, 4, true},
		{[]byte{0xFF, 0xFF, 0xFF, 0x7F}, MaxRemaining, 4, true},
		{[]byte{0x80, 0x00}, 0, 2, true}, // more bytes than needed
		{nil, 0, 0, false},
		{[]byte{0x80}, 0, 0, false},                         // cut
		{[]byte{0xFF, 0xFF, 0xFF, 0xFF, 0x01}, 0, 0, false}, // a fifth byte [MQTT-1.5.5-1]
	} {
		n, size, ok := Varint(tc.in)
		if n != tc.n || size != tc.size || ok != tc.ok {
			t.Errorf("Varint(% X) = %d, %d, %v; want %d, %d, %v", tc.in, n, size, ok, tc.n, tc.size, tc.ok)
		}
	}
}

func TestAppendVarintRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 16383, 16384, 2097151, 2097152, MaxRemaining} {
		b := AppendVarint([]byte{0xAA}, n)
		got, size, ok := Varint(b[1:])
		if !ok || got != n || size != len(b)-1 || size != varintLen(n) {
			t.Errorf("%d: % X decodes to %d in %d bytes (%v), varintLen %d", n, b, got, size, ok, varintLen(n))
		}
	}
}

func TestAppendHeader(t *testing.T) {
	if got, want := AppendHeader([]byte{1}, 0x32, 200), []byte{1, 0x32, 0xC8, 0x01}; !bytes.Equal(got, want) {
		t.Fatalf("% X, want % X", got, want)
	}
}
