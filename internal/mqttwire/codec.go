package mqttwire

import (
	"bytes"

	"github.com/mochi-mqtt/server/v2/packets"
)

// codec is what mqttwire knows of a packet type: the codec's encoder and
// decoder for it, and who may send it (MQTT 5 §2.1.2).
type codec struct {
	encode     func(*packets.Packet, *bytes.Buffer) error
	decode     func(*packets.Packet, []byte) error
	fromClient bool
	fromServer bool
}

// codecs is indexed by packet type; type 0 is reserved and has none.
var codecs = [16]codec{
	packets.Connect:     {(*packets.Packet).ConnectEncode, (*packets.Packet).ConnectDecode, true, false},
	packets.Connack:     {(*packets.Packet).ConnackEncode, (*packets.Packet).ConnackDecode, false, true},
	packets.Publish:     {(*packets.Packet).PublishEncode, (*packets.Packet).PublishDecode, true, true},
	packets.Puback:      {(*packets.Packet).PubackEncode, (*packets.Packet).PubackDecode, true, true},
	packets.Pubrec:      {(*packets.Packet).PubrecEncode, (*packets.Packet).PubrecDecode, true, true},
	packets.Pubrel:      {(*packets.Packet).PubrelEncode, (*packets.Packet).PubrelDecode, true, true},
	packets.Pubcomp:     {(*packets.Packet).PubcompEncode, (*packets.Packet).PubcompDecode, true, true},
	packets.Subscribe:   {(*packets.Packet).SubscribeEncode, (*packets.Packet).SubscribeDecode, true, false},
	packets.Suback:      {(*packets.Packet).SubackEncode, (*packets.Packet).SubackDecode, false, true},
	packets.Unsubscribe: {(*packets.Packet).UnsubscribeEncode, (*packets.Packet).UnsubscribeDecode, true, false},
	packets.Unsuback:    {(*packets.Packet).UnsubackEncode, (*packets.Packet).UnsubackDecode, false, true},
	packets.Pingreq:     {(*packets.Packet).PingreqEncode, (*packets.Packet).PingreqDecode, true, false},
	packets.Pingresp:    {(*packets.Packet).PingrespEncode, (*packets.Packet).PingrespDecode, false, true},
	packets.Disconnect:  {(*packets.Packet).DisconnectEncode, (*packets.Packet).DisconnectDecode, true, true},
	packets.Auth:        {(*packets.Packet).AuthEncode, (*packets.Packet).AuthDecode, true, true},
}

// codecFor returns the entry for packet type t, nil for one that does
// not exist.
func codecFor(t byte) *codec {
	if int(t) < len(codecs) && codecs[t].encode != nil {
		return &codecs[t]
	}
	return nil
}

// SentByClient reports whether a client may send packets of type t
// (MQTT 5 §2.1.2): a server receiving another type has a Protocol Error.
func SentByClient(t byte) bool {
	c := codecFor(t)
	return c != nil && c.fromClient
}

// SentByServer reports whether a server may send packets of type t
// (MQTT 5 §2.1.2): a client receiving another type has a Protocol Error.
func SentByServer(t byte) bool {
	c := codecFor(t)
	return c != nil && c.fromServer
}
