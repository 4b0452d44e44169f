package upstreamtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// Raw packets, for the test doubles that play an upstream broker where
// Mosquitto cannot be made to misbehave.

// ListenLoopback listens on a free loopback port until the test ends;
// the test's cleanup closes it and waits for the goroutines added to wg.
func ListenLoopback(t testing.TB) (net.Listener, *sync.WaitGroup) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wg := &sync.WaitGroup{}
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln, wg
}

// Frame builds a packet: header byte h, the remaining length, parts.
func Frame(h byte, parts ...[]byte) []byte {
	body := bytes.Join(parts, nil)
	n := len(body)
	b := []byte{h}
	for {
		c := byte(n & 0x7F)
		n >>= 7
		if n > 0 {
			c |= 0x80
		}
		b = append(b, c)
		if n == 0 {
			return append(b, body...)
		}
	}
}

// Str encodes s as an MQTT string: a two-byte length, then the bytes.
func Str(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

// ReadPacket reads one packet and returns its type and body.
func ReadPacket(r *bufio.Reader) (kind byte, body []byte, err error) {
	h, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n := 0
	for i := 0; ; i++ {
		if i == 4 {
			return 0, nil, fmt.Errorf("packet type %d: remaining length of more than four bytes", h>>4)
		}
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n |= int(b&0x7F) << (7 * i)
		if b&0x80 == 0 {
			break
		}
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return h >> 4, body, nil
}

// PublishSize is the encoded size of a PUBLISH of topic and a payload of
// n bytes at qos, as the bridge's client sends it on protocol version v
// (5: an empty property block).
func PublishSize(topic string, n int, qos, v byte) int {
	rem := 2 + len(topic) + n
	if qos > 0 {
		rem += 2
	}
	if v == 5 {
		rem++
	}
	size := 1 + rem
	for ; rem > 0; rem >>= 7 {
		size++
	}
	return size
}
