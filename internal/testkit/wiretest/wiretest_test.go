package wiretest

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestFrame frames packets of several sizes and reads them back with
// mqttwire's reader.
func TestFrame(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 16383, 16384, 200000} {
		body := bytes.Repeat([]byte{0xA5}, n)
		b := Frame(0x30, body)
		fh, got, err := mqttwire.ReadPacket(bufio.NewReader(bytes.NewReader(b)), 0, nil)
		if err != nil || fh.Type != packets.Publish || !bytes.Equal(got, body) {
			t.Errorf("%d-byte body: type %d, %d bytes, %v", n, fh.Type, len(got), err)
		}
	}
}

// TestPublishSize compares PublishSize with what the codec encodes.
func TestPublishSize(t *testing.T) {
	for _, tc := range []struct {
		topic      string
		n          int
		qos, level byte
	}{
		{"a", 0, 0, 4}, {"up/held", 4, 2, 5}, {"t", 200, 1, 5}, {"long/topic", 20000, 1, 4},
	} {
		pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: tc.qos}, ProtocolVersion: tc.level,
			TopicName: tc.topic, Payload: make([]byte, tc.n)}
		if tc.qos > 0 {
			pk.PacketID = 7
		}
		b, err := mqttwire.Encode(pk)
		if err != nil {
			t.Fatal(err)
		}
		if got := PublishSize(tc.topic, tc.n, tc.qos, tc.level); got != len(b) {
			t.Errorf("PublishSize(%q, %d, %d, %d) = %d, the codec encodes %d bytes", tc.topic, tc.n, tc.qos, tc.level, got, len(b))
		}
	}
}

// TestStr checks the string's length prefix.
func TestStr(t *testing.T) {
	if got := Str("id"); !bytes.Equal(got, []byte{0, 2, 'i', 'd'}) {
		t.Errorf("Str(id) = % X", got)
	}
}
