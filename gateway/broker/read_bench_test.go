package broker

import (
	"fmt"
	"net"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// loopConn is a net.Conn whose reads return the same bytes over and over:
// a client that never stops sending. Nothing else of it is used but its
// address.
type loopConn struct {
	net.Conn
	data []byte
	off  int
}

func (l *loopConn) Read(p []byte) (int, error) {
	n := copy(p, l.data[l.off:])
	l.off = (l.off + n) % len(l.data)
	return n, nil
}

func (l *loopConn) RemoteAddr() net.Addr { return &net.TCPAddr{} }

// BenchmarkReadPacket measures the connection reader on a stream of QoS 1
// PUBLISH packets: fixed header, remaining length and body, with the read
// buffer lent and given back. The body, which a PUBLISH keeps as its
// payload, is the one allocation a packet may cost.
func BenchmarkReadPacket(b *testing.B) {
	for _, payload := range []int{32, 1 << 10, 64 << 10} {
		b.Run(fmt.Sprintf("payload=%d", payload), func(b *testing.B) {
			tb := startBroker(b, nil)
			pk := wirePublish(4, 2, "plant/greenhouse-1/temp", 1, string(make([]byte, payload)))
			c := newConn(tb.Broker, &loopConn{data: pk}, "bench")
			maxSize := tb.Broker.opts.MaxPacketSize
			b.SetBytes(int64(len(pk)))
			b.ReportAllocs()
			for b.Loop() {
				fh, body, err := c.readPacket(maxSize)
				if err != nil || fh.Type != packets.Publish || fh.Remaining != len(body) {
					b.Fatalf("read %+v, %d bytes: %v", fh, len(body), err)
				}
			}
		})
	}
}
