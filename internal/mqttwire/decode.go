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
	switch t := pk.FixedHeader.Type; t {
	case packets.Connect:
		return pk.ConnectDecode(body)
	case packets.Connack:
		return pk.ConnackDecode(body)
	case packets.Publish:
		return pk.PublishDecode(body)
	case packets.Puback:
		return pk.PubackDecode(body)
	case packets.Pubrec:
		return pk.PubrecDecode(body)
	case packets.Pubrel:
		return pk.PubrelDecode(body)
	case packets.Pubcomp:
		return pk.PubcompDecode(body)
	case packets.Subscribe:
		return pk.SubscribeDecode(body)
	case packets.Suback:
		return pk.SubackDecode(body)
	case packets.Unsubscribe:
		return pk.UnsubscribeDecode(body)
	case packets.Unsuback:
		return pk.UnsubackDecode(body)
	case packets.Pingreq:
		return pk.PingreqDecode(body)
	case packets.Pingresp:
		return pk.PingrespDecode(body)
	case packets.Disconnect:
		return pk.DisconnectDecode(body)
	case packets.Auth:
		return pk.AuthDecode(body)
	default:
		return fmt.Errorf("no packet of type %d", t)
	}
}
