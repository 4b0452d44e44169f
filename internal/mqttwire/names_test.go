package mqttwire

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

func TestPacketName(t *testing.T) {
	for typ, want := range map[byte]string{packets.Publish: "Publish", packets.Pubrel: "Pubrel", packets.Auth: "Auth", 16: "packet type 16"} {
		if got := PacketName(typ); got != want {
			t.Errorf("PacketName(%d) = %q, want %q", typ, got, want)
		}
	}
}

// TestDirections: MQTT 5 §2.1.2's table of who sends what.
func TestDirections(t *testing.T) {
	both := []byte{packets.Publish, packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp, packets.Disconnect, packets.Auth}
	client := []byte{packets.Connect, packets.Subscribe, packets.Unsubscribe, packets.Pingreq}
	server := []byte{packets.Connack, packets.Suback, packets.Unsuback, packets.Pingresp}
	check := func(types []byte, byClient, byServer bool) {
		for _, typ := range types {
			if SentByClient(typ) != byClient || SentByServer(typ) != byServer {
				t.Errorf("%s: by client %v, by server %v; want %v, %v", PacketName(typ), SentByClient(typ), SentByServer(typ), byClient, byServer)
			}
		}
	}
	check(both, true, true)
	check(client, true, false)
	check(server, false, true)
	check([]byte{0}, false, false)
}

func TestReasonName(t *testing.T) {
	seen := map[byte]bool{}
	for _, c := range reasons {
		if seen[c.Code] {
			t.Errorf("reason code 0x%02X twice", c.Code)
		}
		seen[c.Code] = true
	}
	for code, want := range map[byte]string{
		0x00: "success",
		0x10: "no matching subscribers",
		0x81: "malformed packet",
		0x87: "not authorized",
		0x95: "packet too large",
		0x9E: "shared subscriptions not supported",
		0xA2: "wildcard subscriptions not supported",
		0x7F: "unknown reason code",
		0xA3: "unknown reason code", // the codec's own, not MQTT's
	} {
		if got := ReasonName(code); got != want {
			t.Errorf("ReasonName(0x%02X) = %q, want %q", code, got, want)
		}
	}
}
