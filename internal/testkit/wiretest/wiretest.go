// Package wiretest is for the test doubles that play an MQTT peer where a
// real one cannot be made to misbehave: a loopback listener that closes
// with the test, packets framed by hand around bytes the test chooses, and
// the size a PUBLISH takes on the wire. The framing is internal/mqttwire's,
// which the doubles read with too; this package only shapes it for a
// test's few lines.
package wiretest

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// Listen listens on a free loopback port until the test ends; the test's
// cleanup closes it and waits for the goroutines added to wg.
func Listen(t testing.TB) (net.Listener, *sync.WaitGroup) {
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

// Frame builds a packet: first byte h, the remaining length, then parts
// as they are, whether or not they make a valid body.
func Frame(h byte, parts ...[]byte) []byte {
	body := bytes.Join(parts, nil)
	return append(mqttwire.AppendHeader(make([]byte, 0, 5+len(body)), h, len(body)), body...)
}

// Str encodes s as an MQTT string: a two-byte length, then the bytes.
func Str(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }

// PublishSize is the encoded size of a PUBLISH of topic and a payload of
// n bytes at qos on protocol version v (5: with an empty property block),
// as the bridge's client sends it: what a proxy counts to stop the
// conversation right after it.
func PublishSize(topic string, n int, qos, v byte) int {
	rem := 2 + len(topic) + n
	if qos > 0 {
		rem += 2 // the packet identifier
	}
	if v == 5 {
		rem++ // the property length, 0
	}
	return len(mqttwire.AppendHeader(nil, 0x30, rem)) + rem
}
