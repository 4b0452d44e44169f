package broker

import (
	"bytes"
	"encoding/binary"
	"unicode/utf8"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The codec decodes a packet's fields but not every rule on their layout:
// it lets a property appear twice (the last value wins), reads a property
// value past the end of the property block, leaves property values the spec
// restricts unchecked, takes the user name as bytes, and ignores bytes after
// the last field of a CONNECT or an acknowledgement. checkBody applies those
// rules to the raw body of a packet the codec has decoded, so that the
// broker never acts on a value the client did not validly send.

// propType is how a property's value is encoded (MQTT 5 §2.2.2.2).
type propType byte

const (
	propByte propType = iota + 1
	propU16
	propU32
	propVarint
	propString
	propBinary
	propPair
)

// propTypes gives the encoding of every property identifier (MQTT 5
// §2.2.2.2); identifiers left at 0 do not exist.
var propTypes = [...]propType{
	packets.PropPayloadFormat:          propByte,
	packets.PropMessageExpiryInterval:  propU32,
	packets.PropContentType:            propString,
	packets.PropResponseTopic:          propString,
	packets.PropCorrelationData:        propBinary,
	packets.PropSubscriptionIdentifier: propVarint,
	packets.PropSessionExpiryInterval:  propU32,
	packets.PropAssignedClientID:       propString,
	packets.PropServerKeepAlive:        propU16,
	packets.PropAuthenticationMethod:   propString,
	packets.PropAuthenticationData:     propBinary,
	packets.PropRequestProblemInfo:     propByte,
	packets.PropWillDelayInterval:      propU32,
	packets.PropRequestResponseInfo:    propByte,
	packets.PropResponseInfo:           propString,
	packets.PropServerReference:        propString,
	packets.PropReasonString:           propString,
	packets.PropReceiveMaximum:         propU16,
	packets.PropTopicAliasMaximum:      propU16,
	packets.PropTopicAlias:             propU16,
	packets.PropMaximumQos:             propByte,
	packets.PropRetainAvailable:        propByte,
	packets.PropUser:                   propPair,
	packets.PropMaximumPacketSize:      propU32,
	packets.PropWildcardSubAvailable:   propByte,
	packets.PropSubIDAvailable:         propByte,
	packets.PropSharedSubAvailable:     propByte,
}

// checkBody checks the body of a packet the codec has decoded into pk
// against the rules the codec leaves out.
func checkBody(pk *packets.Packet, body []byte) error {
	v5 := pk.ProtocolVersion == 5
	switch t := pk.FixedHeader.Type; t {
	case packets.Connect:
		return checkConnectBody(body)
	case packets.Publish:
		if v5 {
			off := 2 + int(binary.BigEndian.Uint16(body))
			if pk.FixedHeader.Qos > 0 {
				off += 2
			}
			_, err := checkProps(body, off, t)
			return err
		}
	case packets.Puback, packets.Pubrec, packets.Pubrel, packets.Pubcomp:
		if !v5 && len(body) != 2 {
			// 3.1.1 §3.4.1 to §3.7.1: the remaining length is 2.
			return failure(rcMalformed, "%s of %d bytes", mqttwire.PacketName(t), len(body))
		}
		if v5 && len(body) > 3 {
			return checkPropsToEnd(body, 3, t) // §3.4.2.2
		}
	case packets.Subscribe, packets.Unsubscribe:
		if v5 {
			_, err := checkProps(body, 2, t)
			return err
		}
	case packets.Disconnect:
		if v5 && len(body) > 1 {
			return checkPropsToEnd(body, 1, t) // §3.14.2.2
		}
	}
	return nil
}

// checkPropsToEnd checks a property block that must end the packet.
func checkPropsToEnd(body []byte, off int, kind byte) error {
	end, err := checkProps(body, off, kind)
	if err == nil && end != len(body) {
		err = failure(rcMalformed, "%d bytes after the %s properties", len(body)-end, mqttwire.PacketName(kind))
	}
	return err
}

// checkProps checks the property block at body[off:] of a packet of type
// kind (packets.WillProperties for a will's) and returns where it ends.
// A property that runs past the block's length makes the packet Malformed;
// one that appears twice (but User Property, which may repeat) or has a
// value its section forbids is a Protocol Error (MQTT 5 §2.2.2.2 and each
// property's section).
func checkProps(body []byte, off int, kind byte) (int, error) {
	name := mqttwire.PacketName(kind)
	if kind == packets.WillProperties {
		name = "will"
	}
	if off > len(body) {
		return 0, failure(rcMalformed, "%s without properties", name)
	}
	n, lb, ok := mqttwire.Varint(body[off:])
	if !ok || off+lb+n > len(body) {
		return 0, failure(rcMalformed, "%s properties length", name)
	}
	end := off + lb + n
	var seen uint64
	for i := off + lb; i < end; {
		id := body[i]
		i++
		var pt propType
		if int(id) < len(propTypes) {
			pt = propTypes[id]
		}
		if pt == 0 {
			return 0, failure(rcMalformed, "unknown property 0x%02X", id)
		}
		if id != packets.PropUser && seen&(1<<id) != 0 {
			return 0, failure(rcProtocolError, "property 0x%02X more than once", id)
		}
		seen |= 1 << id
		var v int
		var s []byte
		switch pt {
		case propByte:
			if i+1 > end {
				return 0, errPropCut(id)
			}
			v = int(body[i])
			i++
		case propU16:
			if i+2 > end {
				return 0, errPropCut(id)
			}
			v = int(binary.BigEndian.Uint16(body[i:]))
			i += 2
		case propU32:
			if i+4 > end {
				return 0, errPropCut(id)
			}
			v = int(binary.BigEndian.Uint32(body[i:]))
			i += 4
		case propVarint:
			var size int
			if v, size, ok = mqttwire.Varint(body[i:end]); !ok {
				return 0, errPropCut(id)
			}
			i += size
		default:
			count := 1
			if pt == propPair {
				count = 2
			}
			for range count {
				if i+2 > end || i+2+int(binary.BigEndian.Uint16(body[i:])) > end {
					return 0, errPropCut(id)
				}
				s = body[i+2 : i+2+int(binary.BigEndian.Uint16(body[i:]))]
				i += 2 + len(s)
				if pt != propBinary && !validString(s) {
					return 0, failure(rcMalformed, "property 0x%02X is not valid UTF-8", id) // [MQTT-1.5.4-1] [MQTT-1.5.4-2]
				}
			}
		}
		switch {
		case (id == packets.PropReceiveMaximum || id == packets.PropMaximumPacketSize) && v == 0:
			// §3.1.2.11.3, §3.1.2.11.4.
			return 0, failure(rcProtocolError, "property 0x%02X is 0", id)
		case (id == packets.PropRequestProblemInfo || id == packets.PropRequestResponseInfo) && v > 1:
			// §3.1.2.11.6, §3.1.2.11.7.
			return 0, failure(rcProtocolError, "property 0x%02X is %d, not 0 or 1", id, v)
		case id == packets.PropSubscriptionIdentifier && v == 0:
			return 0, failure(rcProtocolError, "subscription identifier 0") // §3.8.2.1.2
		case id == packets.PropResponseTopic && matcher.ValidateTopic(string(s)) != nil:
			// A topic name, without wildcards [MQTT-3.3.2-14]; the
			// codec would drop it on the way to the receiver.
			return 0, failure(rcProtocolError, "response topic %q is not a topic name", s)
		}
	}
	if kind == packets.Connect && seen&(1<<packets.PropAuthenticationData) != 0 && seen&(1<<packets.PropAuthenticationMethod) == 0 {
		return 0, failure(rcProtocolError, "authentication data without an authentication method") // §3.1.2.11.10
	}
	return end, nil
}

func errPropCut(id byte) error {
	return failure(rcMalformed, "property 0x%02X runs past the property length", id)
}

// validString reports whether s is a valid MQTT UTF-8 string: well-formed
// UTF-8 without U+0000 [MQTT-1.5.4-1] [MQTT-1.5.4-2].
func validString(s []byte) bool {
	return utf8.Valid(s) && bytes.IndexByte(s, 0) < 0
}

// checkConnectBody walks a CONNECT the codec has decoded: its properties,
// a user name that is a UTF-8 string ([MQTT-3.1.3-12] (5.0),
// [MQTT-3.1.3-11] (3.1.1)), and nothing after the last field its flags
// announce ([MQTT-3.1.2-16] [MQTT-3.1.2-18] (5.0), [MQTT-3.1.2-18]
// [MQTT-3.1.2-20] (3.1.1)).
func checkConnectBody(body []byte) error {
	field := func(off int) (int, []byte, error) {
		if off+2 > len(body) || off+2+int(binary.BigEndian.Uint16(body[off:])) > len(body) {
			return 0, nil, failure(rcMalformed, "truncated CONNECT")
		}
		n := int(binary.BigEndian.Uint16(body[off:]))
		return off + 2 + n, body[off+2 : off+2+n], nil
	}
	off, _, err := field(0) // protocol name
	if err != nil || off+4 > len(body) {
		return failure(rcMalformed, "truncated CONNECT")
	}
	version, flags := body[off], body[off+1]
	if version < 3 || version > 5 {
		return nil // answered as an unsupported version
	}
	off += 4 // version, flags, keep alive
	if version == 5 {
		if off, err = checkProps(body, off, packets.Connect); err != nil {
			return err
		}
	}
	if off, _, err = field(off); err != nil { // client identifier
		return err
	}
	if flags&0x04 != 0 {
		if version == 5 {
			if off, err = checkProps(body, off, packets.WillProperties); err != nil {
				return err
			}
		}
		if off, _, err = field(off); err != nil { // will topic
			return err
		}
		if off, _, err = field(off); err != nil { // will payload
			return err
		}
	}
	if flags&0x80 != 0 {
		var user []byte
		if off, user, err = field(off); err != nil {
			return err
		}
		if !validString(user) {
			return failure(rcMalformed, "user name is not a UTF-8 string")
		}
	}
	if flags&0x40 != 0 {
		if off, _, err = field(off); err != nil {
			return err
		}
	}
	if off != len(body) {
		return failure(rcMalformed, "%d bytes after the last CONNECT field", len(body)-off)
	}
	return nil
}
