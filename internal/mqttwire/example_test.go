package mqttwire_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/mochi-mqtt/server/v2/packets"
)

// A peer's reader: one packet at a time, decoded by type, and a refusal
// that carries the reason code to end the connection with.
func ExampleReadPacket() {
	var stream bytes.Buffer
	pub := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		ProtocolVersion: 5, TopicName: "plant/temp", PacketID: 7, Payload: []byte("21.5")}
	if err := mqttwire.EncodeTo(&stream, pub); err != nil {
		panic(err)
	}
	stream.Write([]byte{0x36, 0}) // a PUBLISH of QoS 3

	r := bufio.NewReader(&stream)
	for {
		fh, body, err := mqttwire.ReadPacket(r, 0, nil)
		var refused *mqttwire.Error
		if errors.As(err, &refused) {
			fmt.Printf("refused, reason 0x%02X: %s\n", refused.Code, refused.Reason)
			return
		}
		pk := &packets.Packet{FixedHeader: fh, ProtocolVersion: 5}
		if err := mqttwire.Decode(pk, body); err != nil {
			panic(err)
		}
		fmt.Printf("%s %q %q, answered with % X\n", mqttwire.PacketName(fh.Type), pk.TopicName, pk.Payload,
			mqttwire.Ack(packets.Puback, pk.PacketID, 0, true, ""))
	}
	// Output:
	// Publish "plant/temp" "21.5", answered with 40 02 00 07
	// refused, reason 0x81: bad fixed header flags 0x36
}
