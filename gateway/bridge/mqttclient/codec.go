package mqttclient

import (
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

// encode encodes pk with mqttwire. The codec fails only for a packet
// without the packet identifier it needs, which the client always sets.
func encode(pk *packets.Packet) []byte {
	b, _ := mqttwire.Encode(pk)
	return b
}

// publishIDOffset returns where the packet id sits in an encoded PUBLISH:
// after the fixed header and the topic.
func publishIDOffset(b []byte, topic string) int {
	_, size, _ := mqttwire.Varint(b[1:])
	return 1 + size + 2 + len(topic)
}

func versionName(v byte) string {
	if v == 4 {
		return "MQTT 3.1.1"
	}
	return "MQTT 5"
}
