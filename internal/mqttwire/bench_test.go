package mqttwire

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// BenchmarkReadPacket reads QoS 1 PUBLISH packets off a stream, into a
// fresh body as the broker does and into a reused one as a bench client
// does; the fresh body is the only allocation a packet may cost.
func BenchmarkReadPacket(b *testing.B) {
	for _, reuse := range []bool{false, true} {
		for _, payload := range []int{32, 1 << 10} {
			b.Run(fmt.Sprintf("payload=%d/reuse=%v", payload, reuse), func(b *testing.B) {
				pk, err := Encode(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
					ProtocolVersion: 4, TopicName: "plant/greenhouse-1/temp", PacketID: 1, Payload: make([]byte, payload)})
				if err != nil {
					b.Fatal(err)
				}
				stream := bytes.Repeat(pk, 64)
				src := bytes.NewReader(stream)
				r := bufio.NewReaderSize(src, 4<<10)
				var buf []byte
				b.SetBytes(int64(len(pk)))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if i%64 == 0 {
						src.Reset(stream)
						r.Reset(src)
					}
					i++
					fh, body, err := ReadPacket(r, 0, buf)
					if err != nil || fh.Type != packets.Publish {
						b.Fatal(err)
					}
					if reuse {
						buf = body
					}
				}
			})
		}
	}
}
