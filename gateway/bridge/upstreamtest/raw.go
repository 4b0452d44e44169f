package upstreamtest

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
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
	return append(mqttwire.AppendHeader(nil, h, len(body)), body...)
}

// Str encodes s as an MQTT string: a two-byte length, then the bytes.
func Str(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

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
	return 1 + len(mqttwire.AppendVarint(nil, rem)) + rem
}
