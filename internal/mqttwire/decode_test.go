package mqttwire

import (
	"errors"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hb      byte
		version byte
		body    []byte
		code    byte
		reason  string
	}{
		// The codec panics on this; Decode must not.
		{"MQTT 5 SUBSCRIBE without options", 0x82, 5, []byte{0, 1, 0, 0, 1, 'a'}, 0x81, "malformed Subscribe packet"},
		// The codec's own code comes through.
		{"3.1.1 SUBSCRIBE for QoS 3", 0x82, 4, []byte{0, 1, 0, 1, 'a', 3}, 0x82, "malformed Subscribe packet: protocol violation: qos out of range"},
		{"PUBLISH without a topic", 0x30, 4, []byte{}, 0x81, "malformed Publish packet: "},
		{"PUBACK without an identifier", 0x40, 4, []byte{0}, 0x81, "malformed Puback packet: "},
	} {
		var fh packets.FixedHeader
		if err := fh.Decode(tc.hb); err != nil {
			t.Fatal(err)
		}
		fh.Remaining = len(tc.body)
		pk := &packets.Packet{FixedHeader: fh, ProtocolVersion: tc.version}
		err := Decode(pk, tc.body)
		var we *Error
		if !errors.As(err, &we) || we.Code != tc.code || !strings.HasPrefix(we.Reason, tc.reason) {
			t.Errorf("%s: %v, want an *Error with code 0x%02X and reason %q…", tc.name, err, tc.code, tc.reason)
		}
	}
}

// TestDecodeDisconnectReasonCode: an MQTT 5 DISCONNECT of one byte is a
// reason code, which the codec alone leaves at 0.
func TestDecodeDisconnectReasonCode(t *testing.T) {
	pk := &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect, Remaining: 1}, ProtocolVersion: 5}
	if err := Decode(pk, []byte{0x8E}); err != nil || pk.ReasonCode != 0x8E {
		t.Fatalf("reason code 0x%02X, %v; want 0x8E", pk.ReasonCode, err)
	}
	pk = &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Disconnect, Remaining: 7}, ProtocolVersion: 5}
	if err := Decode(pk, []byte{0x04, 5, 0x11, 0, 0, 0, 9}); err != nil || pk.ReasonCode != 0x04 || pk.Properties.SessionExpiryInterval != 9 {
		t.Fatalf("reason code 0x%02X expiry %d, %v; want 0x04 and 9", pk.ReasonCode, pk.Properties.SessionExpiryInterval, err)
	}
}
