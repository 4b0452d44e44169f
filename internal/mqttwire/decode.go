package mqttwire

import (
	"errors"
	"fmt"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Decode decodes body into pk with the codec's decoder for
// pk.FixedHeader.Type, at pk.ProtocolVersion; pk.FixedHeader must be the
// one ReadHeader returned, Remaining included, since the codec reads it.
// The decoder runs under recover: the codec panics on some truncated
// inputs, and no input may take a peer down. A failure is an *Error: the
// codec's own reason code where it gives one, Malformed Packet otherwise.
// Decode also reads the reason code of an MQTT 5 DISCONNECT that has
// nothing else, which the codec skips (§3.14.2.1).
//
// The strings and payload the codec decodes point into body.
func Decode(pk *packets.Packet, body []byte) (err error) {
	t := pk.FixedHeader.Type
	defer func() {
		if r := recover(); r != nil {
			err = Errorf(codeMalformed, "malformed %s packet", PacketName(t))
		}
	}()
	if err := decodeBody(pk, body); err != nil {
		var code packets.Code
		if errors.As(err, &code) {
			return Errorf(code.Code, "malformed %s packet: %s", PacketName(t), code.Reason)
		}
		return Errorf(codeMalformed, "malformed %s packet: %v", PacketName(t), err)
	}
	if t == packets.Disconnect && pk.ProtocolVersion == 5 && len(body) == 1 {
		pk.ReasonCode = body[0]
	}
	return nil
}

func decodeBody(pk *packets.Packet, body []byte) error {
	c := codecFor(pk.FixedHeader.Type)
	if c == nil {
		return fmt.Errorf("no packet of type %d", pk.FixedHeader.Type)
	}
	return c.decode(pk, body)
}
