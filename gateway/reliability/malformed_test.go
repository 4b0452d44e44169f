package reliability

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The malformed-input replay: a corpus of hostile byte streams, each sent
// over its own TCP connection to the real gateway, after which a
// well-behaved client must still be served. The corpus is a table here;
// testdata/malformed/ holds the same streams as files, for replaying them
// with other tools (see TestMalformedCorpusFiles).

// Limits of the replay's gateway: small, so that a case can exceed them
// with a few kilobytes.
const (
	malformedMaxPacket = 4096
	malformedAliasMax  = 10
)

// Waits of the replay. A broker that answers does so within milliseconds
// on loopback; malformedAnswerWait only bounds a broker that never will,
// and malformedControlWait the control client's round trip, both on the
// suite's time scale. malformedOpenWait is how long a connection that sent
// part of a packet is watched before it counts as waiting for the rest.
var (
	malformedAnswerWait  = testkit.Scale(3 * time.Second)
	malformedControlWait = testkit.Scale(5 * time.Second)
)

const (
	malformedOpenWait  = 500 * time.Millisecond
	malformedDripPause = 10 * time.Millisecond
)

// CONNECT flags (§3.1.2.3).
const (
	malformedClean      = 0x02
	malformedWill       = 0x04
	malformedWillQoS1   = 0x08
	malformedWillQoS2   = 0x10
	malformedWillRetain = 0x20
	malformedPassword   = 0x40
	malformedUser       = 0x80
)

// malformedCase is one hostile stream and what MQTT 5 says of it.
type malformedCase struct {
	name  string
	level byte // 0: the bytes open the connection; 4 or 5: they follow an accepted CONNECT at that protocol level
	send  []byte
	why   string // what is wrong, with the normative statement
	// codes are the reason codes MQTT 5 names for the error, in a CONNACK
	// (level 0), a DISCONNECT (level 5), or a SUBACK for a filter the
	// broker may refuse alone; 0x00 marks input that must be accepted.
	// When the broker answers, its code must be one of them. Empty: the
	// spec names none (MQTT 3.1.1, a stream that ends, no CONNECT yet),
	// and the broker must close without a word.
	codes []byte
	// deviation is what the broker answers today where MQTT 5 names
	// another code: logged and recorded as a known deviation rather than
	// failed. Delete it once the broker answers as the spec says.
	deviation []byte
	open      bool // the stream stops inside a packet: the broker must keep waiting, and serve others meanwhile
	drip      bool // sent a byte at a time
	// halfClose shuts the sending side after the bytes: the stream ends
	// inside a packet.
	halfClose bool
}

func malformedU16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func malformedU32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// malformedStr encodes a UTF-8 string field: a two-byte length, the bytes.
func malformedStr(s string) []byte { return append(malformedU16(uint16(len(s))), s...) }

// malformedFrame builds a packet: header byte h, the remaining length,
// then parts.
func malformedFrame(h byte, parts ...[]byte) []byte {
	body := bytes.Join(parts, nil)
	return append(mqttwire.AppendHeader(nil, h, len(body)), body...)
}

// malformedProps builds a property block: its length, then the properties.
func malformedProps(ps ...[]byte) []byte {
	body := bytes.Join(ps, nil)
	return append(mqttwire.AppendVarint(nil, len(body)), body...)
}

// malformedConnect builds a CONNECT with keep alive 30 s. props is the
// property block as sent (nil: none, as in 3.1.1); rest follows the client
// identifier (will properties, will topic and payload, user name, password).
func malformedConnect(name string, level, flags byte, props []byte, id string, rest ...[]byte) []byte {
	vh := append(malformedStr(name), level, flags, 0, 30)
	vh = append(vh, props...)
	return malformedFrame(packets.Connect<<4, append([][]byte{vh, malformedStr(id)}, rest...)...)
}

// malformedConnect5 builds an MQTT 5 CONNECT.
func malformedConnect5(flags byte, props []byte, id string, rest ...[]byte) []byte {
	return malformedConnect("MQTT", 5, flags, props, id, rest...)
}

// malformedPublish builds a PUBLISH; the packet identifier goes in for QoS
// 1 and 2, props (nil for 3.1.1) after it.
func malformedPublish(flags byte, topic string, pid uint16, props []byte, payload string) []byte {
	parts := [][]byte{malformedStr(topic)}
	if flags&0x06 != 0 {
		parts = append(parts, malformedU16(pid))
	}
	return malformedFrame(packets.Publish<<4|flags, append(parts, props, []byte(payload))...)
}

// malformedSubscribe builds a SUBSCRIBE of one filter; props nil for 3.1.1.
func malformedSubscribe(pid uint16, props []byte, filter string, opts byte) []byte {
	return malformedFrame(packets.Subscribe<<4|2, malformedU16(pid), props, malformedStr(filter), []byte{opts})
}

// malformedNoProps is an empty MQTT 5 property block.
var malformedNoProps = []byte{0}

// malformedCorpus returns the cases, in the order they are replayed.
func malformedCorpus() []malformedCase {
	// Reason codes named in the corpus (§2.4).
	const (
		rcSuccess        = 0x00
		rcV3BadVersion   = 0x01 // the 3.1.1 CONNACK return code
		rcMalformed      = 0x81
		rcProtocol       = 0x82
		rcBadVersion     = 0x84
		rcNotAuthorized  = 0x87
		rcBadAuthMethod  = 0x8C
		rcFilterInvalid  = 0x8F
		rcTopicInvalid   = 0x90
		rcAliasInvalid   = 0x94
		rcPacketTooLarge = 0x95
	)
	big := strings.Repeat("x", malformedMaxPacket+100)
	clean := byte(malformedClean)
	np := malformedNoProps
	willRest := [][]byte{malformedNoProps, malformedStr("will/t"), malformedStr("gone")}
	return []malformedCase{
		// The first packet of a connection.
		{name: "PINGREQ before CONNECT", send: []byte{0xC0, 0}, why: "the first packet must be CONNECT [MQTT-3.1.0-1]"},
		{name: "PUBLISH before CONNECT", send: malformedPublish(0, "a", 0, np, "x"), why: "[MQTT-3.1.0-1]"},
		{name: "SUBSCRIBE before CONNECT", send: malformedSubscribe(1, np, "a/#", 0), why: "[MQTT-3.1.0-1]"},
		{name: "AUTH before CONNECT", send: []byte{0xF0, 0}, why: "[MQTT-3.1.0-1]; AUTH follows a CONNECT with an authentication method (§4.12)"},
		{name: "reserved type 0 first", send: []byte{0x00, 0}, why: "type 0 is reserved (§2.1.2), and no CONNECT [MQTT-3.1.0-1]"},
		{name: "CONNACK from a client first", send: []byte{0x20, 2, 0, 0}, why: "[MQTT-3.1.0-1]"},

		// The fixed header and remaining length of CONNECT.
		{name: "CONNECT with header flags 0001", send: append([]byte{0x11}, malformedConnect5(clean, np, "c")[1:]...),
			why: "reserved fixed header flags [MQTT-2.1.3-1]: malformed", codes: []byte{rcMalformed}},
		{name: "CONNECT with a 5-byte remaining length", send: []byte{0x10, 0x80, 0x80, 0x80, 0x80, 0x01},
			why: "a variable byte integer has at most 4 bytes [MQTT-1.5.5-1]", codes: []byte{rcMalformed}},
		{name: "CONNECT announcing 268435455 bytes", send: []byte{0x10, 0xFF, 0xFF, 0xFF, 0x7F, 0, 4, 'M', 'Q', 'T', 'T'},
			why: "larger than broker.max_packet_size (§3.2.2.3.6)", codes: []byte{rcPacketTooLarge}},
		{name: "CONNECT larger than the maximum packet size", send: malformedConnect5(clean, malformedProps([]byte{0x26}, malformedStr("k"), malformedStr(big)), "c"),
			why: "a user property makes it larger than broker.max_packet_size (§3.2.2.3.6)", codes: []byte{rcPacketTooLarge}},
		{name: "CONNECT with remaining length 0", send: []byte{0x10, 0}, why: "no protocol name: malformed (§3.1.2.1)", codes: []byte{rcMalformed}},
		{name: "CONNECT cut short, then the stream ends", send: []byte{0x10, 0x20, 0, 4, 'M', 'Q', 'T', 'T', 5}, halfClose: true,
			why: "the remaining length promises more than the stream holds"},
		{name: "CONNECT longer than its data, stream kept open", send: []byte{0x10, 0x40, 0, 4, 'M', 'Q', 'T', 'T', 5, 2}, open: true,
			why: "slow loris: the broker waits up to its connect timeout, and serves others"},
		{name: "slow loris: CONNECT header byte only", send: []byte{0x10}, open: true, why: "a fixed header cut after its first byte"},
		{name: "slow loris: remaining length never ends", send: []byte{0x10, 0xFF, 0xFF}, open: true, why: "a remaining length cut inside its continuation bytes"},
		{name: "slow loris: a valid CONNECT a byte at a time", send: malformedConnect5(clean, np, "dripped"), drip: true, codes: []byte{rcSuccess},
			why: "not malformed, only slow: it must be accepted"},

		// The variable header of CONNECT.
		{name: "CONNECT protocol name MQTX", send: malformedConnect("MQTX", 5, clean, np, "c"),
			why: "[MQTT-3.1.2-1]: the server MAY answer 0x84 Unsupported Protocol Version", codes: []byte{rcBadVersion}},
		{name: "CONNECT empty protocol name", send: malformedConnect("", 5, clean, np, "c"), why: "[MQTT-3.1.2-1]", codes: []byte{rcBadVersion}},
		{name: "CONNECT protocol level 3 named MQTT", send: malformedConnect("MQTT", 3, clean, nil, "c"),
			why: "level 3 is MQTT 3.1, named MQIsdp; §3.1.2.2 allows 0x84 (the 3.1.1 return code 1 is what a pre-5 client reads)", codes: []byte{rcBadVersion, rcV3BadVersion}},
		{name: "CONNECT protocol level 6", send: malformedConnect("MQTT", 6, clean, np, "c"), why: "§3.1.2.2", codes: []byte{rcBadVersion, rcV3BadVersion}},
		{name: "CONNECT reserved flag", send: malformedConnect5(clean|1, np, "c"), why: "[MQTT-3.1.2-3]", codes: []byte{rcMalformed}},
		{name: "CONNECT will QoS without will", send: malformedConnect5(clean|malformedWillQoS1, np, "c"), why: "[MQTT-3.1.2-11]", codes: []byte{rcMalformed}},
		{name: "CONNECT will retain without will", send: malformedConnect5(clean|malformedWillRetain, np, "c"), why: "[MQTT-3.1.2-13]", codes: []byte{rcMalformed}},
		{name: "CONNECT will QoS 3", send: malformedConnect5(clean|malformedWill|malformedWillQoS1|malformedWillQoS2, np, "c", willRest...),
			why: "[MQTT-3.1.2-12]", codes: []byte{rcMalformed}},
		{name: "CONNECT will flag without will topic", send: malformedConnect5(clean|malformedWill, np, "c"), why: "§3.1.3.2: the payload lacks the will", codes: []byte{rcMalformed}},
		{name: "CONNECT will topic with a wildcard", send: malformedConnect5(clean|malformedWill, np, "c", malformedNoProps, malformedStr("a/#"), malformedStr("x")),
			why: "a will topic is a topic name [MQTT-3.1.3-11] [MQTT-3.3.2-2]", codes: []byte{rcTopicInvalid, rcMalformed, rcProtocol}},
		{name: "CONNECT user name flag without user name", send: malformedConnect5(clean|malformedUser, np, "c"),
			why: "[MQTT-3.1.2-17] names no code: malformed (the payload lacks a field) or a protocol error", codes: []byte{rcMalformed, rcProtocol}},
		{name: "CONNECT password without user name (valid in 5.0)", send: malformedConnect5(clean|malformedPassword, np, "pw-only", malformedStr("pw")),
			why: "MQTT 5 allows it (§3.1.2.9); a control case, which must be accepted", codes: []byte{rcSuccess}},
		{name: "CONNECT client id not UTF-8", send: malformedConnect5(clean, np, "c\xff"), why: "[MQTT-1.5.4-1]", codes: []byte{rcMalformed}},
		{name: "CONNECT client id with U+0000", send: malformedConnect5(clean, np, "c\x00d"), why: "[MQTT-1.5.4-2]", codes: []byte{rcMalformed}},
		{name: "CONNECT client id with a UTF-16 surrogate", send: malformedConnect5(clean, np, "c\xed\xa0\x80"), why: "[MQTT-1.5.4-1]", codes: []byte{rcMalformed}},
		{name: "CONNECT client id longer than the packet", send: malformedFrame(0x10, malformedStr("MQTT"), []byte{5, clean, 0, 30, 0}, []byte{0xFF, 0xFF, 'a', 'b', 'c'}),
			why: "a string runs past the end of the packet (§1.5.4)", codes: []byte{rcMalformed}},
		{name: "CONNECT user property key not UTF-8", send: malformedConnect5(clean, malformedProps([]byte{0x26}, malformedStr("\xff"), malformedStr("v")), "c"),
			why: "[MQTT-1.5.4-1]", codes: []byte{rcMalformed}},

		// CONNECT properties (§3.1.2.11).
		{name: "CONNECT properties longer than the packet", send: malformedConnect5(clean, []byte{9, 0x11}, "c"), why: "the property length runs past the packet", codes: []byte{rcMalformed}},
		{name: "CONNECT unknown property 0x7F", send: malformedConnect5(clean, malformedProps([]byte{0x7F, 0}), "c"),
			why: "an identifier not valid for the packet is malformed (§2.2.2.2)", codes: []byte{rcMalformed}},
		{name: "CONNECT with a PUBLISH property (topic alias)", send: malformedConnect5(clean, malformedProps([]byte{0x23, 0, 1}), "c"), why: "§2.2.2.2", codes: []byte{rcMalformed}},
		{name: "CONNECT with a will property (will delay)", send: malformedConnect5(clean, malformedProps([]byte{0x18, 0, 0, 0, 1}), "c"), why: "§2.2.2.2", codes: []byte{rcMalformed}},
		{name: "CONNECT session expiry twice", send: malformedConnect5(clean, malformedProps([]byte{0x11}, malformedU32(10), []byte{0x11}, malformedU32(20)), "c"),
			why: "§3.1.2.11.2: including it twice is a protocol error", codes: []byte{rcProtocol}},
		{name: "CONNECT topic alias maximum twice", send: malformedConnect5(clean, malformedProps([]byte{0x22, 0, 5, 0x22, 0, 6}), "c"), why: "§3.1.2.11.5", codes: []byte{rcProtocol}},
		{name: "CONNECT receive maximum 0", send: malformedConnect5(clean, malformedProps([]byte{0x21, 0, 0}), "c"), why: "§3.1.2.11.3: the value 0 is a protocol error", codes: []byte{rcProtocol}},
		{name: "CONNECT receive maximum cut", send: malformedConnect5(clean, malformedProps([]byte{0x21, 0}), "c"), why: "a two-byte integer of one byte", codes: []byte{rcMalformed}},
		{name: "CONNECT maximum packet size 0", send: malformedConnect5(clean, malformedProps([]byte{0x27}, malformedU32(0)), "c"), why: "§3.1.2.11.4", codes: []byte{rcProtocol}},
		{name: "CONNECT request problem information 2", send: malformedConnect5(clean, malformedProps([]byte{0x17, 2}), "c"), why: "§3.1.2.11.7: only 0 or 1", codes: []byte{rcProtocol}},
		{name: "CONNECT with an unsupported authentication method", send: malformedConnect5(clean, malformedProps([]byte{0x15}, malformedStr("SCRAM-SHA-1")), "c"),
			why: "§4.12: the server MAY answer 0x8C Bad authentication method or 0x87", codes: []byte{rcBadAuthMethod, rcNotAuthorized}},

		// MQTT 3.1.1 CONNECT: a malformed one is closed without CONNACK [MQTT-3.1.4-1] (3.1.1).
		{name: "3.1.1 CONNECT reserved flag", send: malformedConnect("MQTT", 4, clean|1, nil, "c"), why: "[MQTT-3.1.2-3] (3.1.1)"},
		{name: "3.1.1 CONNECT client id not UTF-8", send: malformedConnect("MQTT", 4, clean, nil, "c\xc3"), why: "[MQTT-1.5.3-1] (3.1.1)"},
		{name: "3.1.1 CONNECT password without user name", send: malformedConnect("MQTT", 4, clean|malformedPassword, nil, "c", malformedStr("pw")), why: "[MQTT-3.1.2-22] (3.1.1)"},

		// After an accepted MQTT 5 CONNECT: DISCONNECT with the reason
		// code, then close (§4.13.1).
		{level: 5, name: "second CONNECT", send: malformedConnect5(clean, np, "again"), why: "[MQTT-3.1.0-2]", codes: []byte{rcProtocol}},
		{level: 5, name: "AUTH without an authentication method", send: []byte{0xF0, 0}, why: "§4.12: no method was agreed at CONNECT", codes: []byte{rcProtocol}},
		{level: 5, name: "AUTH with header flags 0001", send: []byte{0xF1, 0}, why: "[MQTT-2.1.3-1]", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "reserved type 0", send: []byte{0x00, 0}, why: "§2.1.2: reserved, forbidden", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "CONNACK from a client", send: []byte{0x20, 3, 0, 0, 0}, why: "a server-only packet", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "SUBACK from a client", send: []byte{0x90, 4, 0, 1, 0, 0}, why: "a server-only packet", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "PINGRESP from a client", send: []byte{0xD0, 0}, why: "a server-only packet", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "PINGREQ with a body", send: []byte{0xC0, 1, 0}, why: "§3.12: PINGREQ has no variable header", codes: []byte{rcMalformed}},
		{level: 5, name: "PINGREQ with a 5-byte remaining length", send: []byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x00}, why: "[MQTT-1.5.5-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "remaining length above 268435455", send: []byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}, why: "[MQTT-1.5.5-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH announcing 268435455 bytes", send: []byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0, 1, 'a'},
			why: "[MQTT-3.2.2-15]: above the Maximum Packet Size in CONNACK", codes: []byte{rcPacketTooLarge}},
		{level: 5, name: "PUBLISH larger than the maximum packet size", send: malformedPublish(0, "a", 0, np, big), why: "[MQTT-3.2.2-15]", codes: []byte{rcPacketTooLarge}},
		{level: 5, name: "PUBLISH with remaining length 0", send: []byte{0x30, 0}, why: "no topic name (§3.3.2)", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH cut short, then the stream ends", send: []byte{0x30, 20, 0, 3, 'a', '/', 'b'}, halfClose: true,
			why: "the remaining length promises more than the stream holds"},
		{level: 5, name: "PUBLISH longer than its data, stream kept open", send: []byte{0x30, 20, 0, 3, 'a', '/', 'b'}, open: true,
			why: "slow loris after CONNECT: the broker waits for the rest, and serves others"},
		{level: 5, name: "slow loris: PUBLISH header byte only", send: []byte{0x32}, open: true, why: "a fixed header cut after its first byte"},
		{level: 5, name: "PUBLISH QoS 3", send: malformedPublish(6, "a", 1, np, "x"), why: "[MQTT-3.3.1-4]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH QoS 0 with DUP", send: malformedPublish(8, "a", 0, np, "x"), why: "[MQTT-3.3.1-2]", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "PUBLISH QoS 1 with packet id 0", send: malformedPublish(2, "a", 0, np, "x"), why: "[MQTT-2.2.1-3]", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "PUBLISH QoS 2 with packet id 0", send: malformedPublish(4, "a", 0, np, "x"), why: "[MQTT-2.2.1-3]", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "PUBLISH topic with +", send: malformedPublish(0, "a/+/b", 0, np, "x"), why: "[MQTT-3.3.2-2]", codes: []byte{rcTopicInvalid, rcMalformed, rcProtocol}},
		{level: 5, name: "PUBLISH topic #", send: malformedPublish(0, "#", 0, np, "x"), why: "[MQTT-3.3.2-2]", codes: []byte{rcTopicInvalid, rcMalformed, rcProtocol}},
		{level: 5, name: "PUBLISH topic not UTF-8", send: malformedPublish(0, "a/\xc0\xaf", 0, np, "x"), why: "[MQTT-1.5.4-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH topic with U+0000", send: malformedPublish(0, "a/\x00", 0, np, "x"), why: "[MQTT-1.5.4-2]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH topic with a UTF-16 surrogate", send: malformedPublish(0, "a/\xed\xbf\xbf", 0, np, "x"), why: "[MQTT-1.5.4-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH topic longer than the packet", send: []byte{0x30, 4, 0xFF, 0xFF, 'a', 'b'}, why: "§1.5.4", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH empty topic without topic alias", send: malformedPublish(0, "", 0, np, "x"), why: "§3.3.2.1: a protocol error", codes: []byte{rcProtocol, rcTopicInvalid}},
		{level: 5, name: "PUBLISH topic alias 0", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x23, 0, 0}), "x"),
			why: "[MQTT-3.3.2-8]: DISCONNECT 0x94 Topic Alias invalid", codes: []byte{rcAliasInvalid}},
		{level: 5, name: "PUBLISH topic alias above the maximum", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x23}, malformedU16(malformedAliasMax+1)), "x"),
			why: "[MQTT-3.3.2-10]: above the Topic Alias Maximum in CONNACK", codes: []byte{rcAliasInvalid}},
		{level: 5, name: "PUBLISH by a topic alias never set", send: malformedPublish(0, "", 0, malformedProps([]byte{0x23, 0, 1}), "x"),
			why: "§3.3.2.3.4: a protocol error", codes: []byte{rcProtocol, rcAliasInvalid}},
		{level: 5, name: "PUBLISH payload format indicator twice", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x01, 0, 0x01, 1}), "x"),
			why: "§3.3.2.3.2: twice is a protocol error", codes: []byte{rcProtocol}},
		{level: 5, name: "PUBLISH with a subscription identifier", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x0B, 1}), "x"), why: "[MQTT-3.3.4-6]", codes: []byte{rcProtocol}},
		{level: 5, name: "PUBLISH with a CONNECT property (session expiry)", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x11}, malformedU32(1)), "x"), why: "§2.2.2.2", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH unknown property 0x7F", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x7F, 1}), "x"), why: "§2.2.2.2", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH message expiry cut", send: malformedPublish(0, "a", 0, malformedProps([]byte{0x02, 0, 0}), ""), why: "a four-byte integer of two bytes", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBLISH properties longer than the packet", send: malformedFrame(0x30, malformedStr("a"), []byte{9, 0x01}), why: "the property length runs past the packet", codes: []byte{rcMalformed}},

		{level: 5, name: "SUBSCRIBE with no filters", send: malformedFrame(0x82, malformedU16(1), np), why: "[MQTT-3.8.3-2]: a protocol error", codes: []byte{rcProtocol}},
		{level: 5, name: "SUBSCRIBE with header flags 0000", send: append([]byte{0x80}, malformedSubscribe(1, np, "a", 0)[1:]...), why: "[MQTT-3.8.1-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "SUBSCRIBE reserved option bits", send: malformedSubscribe(1, np, "a", 0xC0), why: "[MQTT-3.8.3-5]", codes: []byte{rcMalformed}},
		{level: 5, name: "SUBSCRIBE QoS 3", send: malformedSubscribe(1, np, "a", 3), why: "§3.8.3.1: a protocol error", codes: []byte{rcProtocol, rcMalformed}},
		{level: 5, name: "SUBSCRIBE retain handling 3", send: malformedSubscribe(1, np, "a", 0x30), why: "§3.8.3.1: a protocol error", codes: []byte{rcProtocol, rcMalformed}},
		{level: 5, name: "SUBSCRIBE filter a/#/b", send: malformedSubscribe(1, np, "a/#/b", 0), why: "[MQTT-4.7.1-1]: # only last; SUBACK 0x8F or DISCONNECT", codes: []byte{rcFilterInvalid, rcMalformed, rcProtocol}},
		{level: 5, name: "SUBSCRIBE filter a+", send: malformedSubscribe(1, np, "a+", 0), why: "[MQTT-4.7.1-2]: + fills a whole level", codes: []byte{rcFilterInvalid, rcMalformed, rcProtocol}},
		{level: 5, name: "SUBSCRIBE empty filter", send: malformedSubscribe(1, np, "", 0), why: "[MQTT-4.7.3-1]", codes: []byte{rcFilterInvalid, rcMalformed, rcProtocol}},
		{level: 5, name: "SUBSCRIBE filter with U+0000", send: malformedSubscribe(1, np, "a\x00/#", 0), why: "[MQTT-1.5.4-2]", codes: []byte{rcMalformed}},
		{level: 5, name: "SUBSCRIBE packet id 0", send: malformedSubscribe(0, np, "a", 0), why: "[MQTT-2.2.1-3]", codes: []byte{rcMalformed, rcProtocol}},
		{level: 5, name: "SUBSCRIBE no local on a shared subscription", send: malformedSubscribe(1, np, "$share/g/a", 0x04), why: "[MQTT-3.8.3-4]", codes: []byte{rcProtocol}},
		{level: 5, name: "SUBSCRIBE subscription identifier 0", send: malformedSubscribe(1, malformedProps([]byte{0x0B, 0}), "a", 0), why: "§3.8.2.1.2: a protocol error", codes: []byte{rcProtocol, rcMalformed}},
		{level: 5, name: "SUBSCRIBE cut in the filter", send: []byte{0x82, 7, 0, 1, 0, 0, 5, 'a', 'b'}, why: "a string runs past the packet", codes: []byte{rcMalformed}},
		{level: 5, name: "UNSUBSCRIBE with no filters", send: malformedFrame(0xA2, malformedU16(1), np), why: "[MQTT-3.10.3-2]", codes: []byte{rcProtocol}},
		{level: 5, name: "UNSUBSCRIBE with header flags 0000", send: malformedFrame(0xA0, malformedU16(1), np, malformedStr("a")), why: "[MQTT-3.10.1-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBREL with header flags 0000", send: []byte{0x60, 2, 0, 1}, why: "[MQTT-3.6.1-1]", codes: []byte{rcMalformed}},
		{level: 5, name: "PUBACK cut in the properties", send: []byte{0x40, 4, 0, 1, 0, 5}, why: "the property length runs past the packet", codes: []byte{rcMalformed}},
		{level: 5, name: "DISCONNECT cut in the properties", send: []byte{0xE0, 2, 0, 5}, why: "the property length runs past the packet", codes: []byte{rcMalformed}},
		{level: 5, name: "DISCONNECT reviving a session that was to end", send: malformedFrame(0xE0, []byte{0}, malformedProps([]byte{0x11}, malformedU32(10))),
			why: "[MQTT-3.14.2-2]: session expiry 0 at CONNECT", codes: []byte{rcProtocol}},

		// After an accepted MQTT 3.1.1 CONNECT: close, with nothing sent (3.1.1 §4.8).
		{level: 4, name: "3.1.1 PUBLISH QoS 3", send: malformedPublish(6, "a", 1, nil, "x"), why: "[MQTT-3.3.1-4] (3.1.1)"},
		{level: 4, name: "3.1.1 PUBLISH topic #", send: malformedPublish(0, "#", 0, nil, "x"), why: "[MQTT-3.3.2-2] (3.1.1)"},
		{level: 4, name: "3.1.1 SUBSCRIBE with no filters", send: malformedFrame(0x82, malformedU16(1)), why: "[MQTT-3.8.3-3] (3.1.1)"},
		{level: 4, name: "3.1.1 AUTH", send: []byte{0xF0, 0}, why: "type 15 is reserved in 3.1.1"},
		{level: 4, name: "3.1.1 second CONNECT", send: malformedConnect("MQTT", 4, clean, nil, "again"), why: "[MQTT-3.1.0-2] (3.1.1)"},
		{level: 4, name: "3.1.1 5-byte remaining length", send: []byte{0x30, 0x80, 0x80, 0x80, 0x80, 0x01}, why: "3.1.1 §2.2.3"},
	}
}

// malformedAnswer is what the broker did with one case.
type malformedAnswer struct {
	packets []string // what it sent, such as "DISCONNECT 0x81"
	kind    string   // CONNACK, DISCONNECT or SUBACK: the packet that carried code
	code    int      // its reason code; -1 when none came
	closed  bool     // it closed the connection
	open    bool     // it still waited for more at the end of the wait
	err     error    // anything else that went wrong reading
}

func (a malformedAnswer) String() string {
	var s []string
	s = append(s, a.packets...)
	switch {
	case a.closed:
		s = append(s, "close")
	case a.open:
		s = append(s, "still open")
	case a.err != nil:
		s = append(s, a.err.Error())
	}
	return strings.Join(s, ", ")
}

// malformedRead reads what the broker sends until it closes the
// connection, or until wait passes with nothing more.
func malformedRead(nc net.Conn, r *bufio.Reader, v5 bool, wait time.Duration) malformedAnswer {
	a := malformedAnswer{code: -1}
	for {
		_ = nc.SetReadDeadline(time.Now().Add(wait))
		h, body, err := malformedPacket(r)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			a.open = true
			return a
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			a.closed = true
			return a
		default:
			a.err = err
			return a
		}
		kind := packets.PacketNames[h>>4]
		code := -1
		switch h >> 4 {
		case packets.Connack:
			if len(body) >= 2 {
				code = int(body[1])
			}
		case packets.Disconnect:
			code = 0 // an empty DISCONNECT is 0x00 [MQTT-3.14.2-1]
			if len(body) > 0 {
				code = int(body[0])
			}
		case packets.Suback:
			rest := body[min(2, len(body)):]
			if v5 {
				if n, size, ok := mqttwire.Varint(rest); ok && size+n <= len(rest) {
					rest = rest[size+n:]
				}
			}
			if len(rest) > 0 {
				code = int(rest[0])
			}
		}
		if code < 0 {
			a.packets = append(a.packets, strings.ToUpper(kind))
			continue
		}
		a.packets = append(a.packets, fmt.Sprintf("%s 0x%02X", strings.ToUpper(kind), code))
		if a.code < 0 {
			a.kind, a.code = strings.ToUpper(kind), code
		}
		if h>>4 == packets.Suback || h>>4 == packets.Connack && code < 0x80 {
			// The connection goes on: nothing more is coming.
			return a
		}
	}
}

// malformedPacket reads one packet: its header byte and body.
func malformedPacket(r *bufio.Reader) (byte, []byte, error) {
	h, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	fh, _, err := mqttwire.ReadHeader(h, r, 0)
	if err != nil {
		return h, nil, fmt.Errorf("from the broker: %w", err)
	}
	body, err := mqttwire.ReadBody(r, fh.Remaining, nil)
	return h, body, err
}

// malformedPrefix is the CONNECT a level 4 or 5 case starts with.
func malformedPrefix(level byte, id string) []byte {
	if level == 4 {
		return malformedConnect("MQTT", 4, malformedClean, nil, id)
	}
	return malformedConnect5(malformedClean, malformedNoProps, id)
}

// malformedRun replays one case on a fresh connection and returns what the
// broker did, leaving a connection the case expects to stay open open:
// the caller closes it once the control client has been served.
func malformedRun(t *testing.T, addr string, i int, tc malformedCase) (malformedAnswer, net.Conn) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatalf("case %d %q: dial: %v", i, tc.name, err)
	}
	r := bufio.NewReader(nc)
	v5 := tc.level != 4
	if tc.level != 0 {
		_ = nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		if _, err := nc.Write(malformedPrefix(tc.level, fmt.Sprintf("malformed-%d", i))); err != nil {
			t.Fatalf("case %d %q: CONNECT: %v", i, tc.name, err)
		}
		_ = nc.SetReadDeadline(time.Now().Add(ioTimeout))
		h, body, err := malformedPacket(r)
		if err != nil || h != packets.Connack<<4 || len(body) < 2 || body[1] != 0 {
			t.Fatalf("case %d %q: the CONNECT before the case was not accepted: header 0x%02X % X %v", i, tc.name, h, body, err)
		}
	}
	// The broker may close before it has read everything: write what
	// it takes, and read its answer meanwhile.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_ = nc.SetWriteDeadline(time.Now().Add(ioTimeout))
		if !tc.drip {
			_, _ = nc.Write(tc.send)
		} else {
			for j := range tc.send {
				if _, err := nc.Write(tc.send[j : j+1]); err != nil {
					return
				}
				time.Sleep(malformedDripPause)
			}
		}
		if tc.halfClose {
			_ = nc.(*net.TCPConn).CloseWrite()
		}
	}()
	if tc.drip {
		<-wrote
	}
	wait := malformedAnswerWait
	if tc.open {
		wait = malformedOpenWait
	}
	a := malformedRead(nc, r, v5, wait)
	<-wrote
	if a.open && tc.open {
		return a, nc
	}
	nc.Close()
	return a, nil
}

// malformedControl connects a well-behaved client, which subscribes,
// publishes at QoS 1 and must receive its own message and the PUBACK
// within malformedControlWait.
func malformedControl(addr string, i int) error {
	deadline := time.Now().Add(malformedControlWait)
	id := fmt.Sprintf("malformed-control-%d", i)
	c, _, err := dial(addr, id, true, 0, 0)
	if err != nil {
		return err
	}
	defer c.close()
	topic := fmt.Sprintf("malformed/control/%d", i)
	if err := c.subscribe(topic, 1); err != nil {
		return err
	}
	payload := fmt.Sprintf("after case %d", i)
	if err := c.publish(topic, payload, 1, 1, false); err != nil {
		return err
	}
	acked, got := false, false
	for !acked || !got {
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("%s: within %v: PUBACK %v, own message %v", id, malformedControlWait, acked, got)
		}
		pk, err := c.read(wait)
		if err != nil {
			return fmt.Errorf("%s: PUBACK %v, own message %v: %w", id, acked, got, err)
		}
		switch pk.FixedHeader.Type {
		case packets.Puback:
			acked = acked || pk.PacketID == 1
		case packets.Publish:
			if pk.TopicName == topic && string(pk.Payload) == payload {
				got = true
			}
			if pk.FixedHeader.Qos == 1 {
				if err := c.ack(packets.Puback, pk.PacketID); err != nil {
					return err
				}
			}
		}
	}
	c.disconnect()
	return nil
}

// malformedGatewayYAML is the replay's gateway: anonymous clients, small
// limits, and no $SYS chatter.
var malformedGatewayYAML = plainYAML("  max_packet_size: 4096\n  topic_alias_maximum: 10\n")

// malformedGoroutineSlack is how many more goroutines the gateway may run
// after the replay than before: the ops endpoint's own, for a scrape in
// progress.
const malformedGoroutineSlack = 5

// malformedCodes formats reason codes as 0x81/0x82.
func malformedCodes(codes []byte) string {
	s := make([]string, len(codes))
	for i, c := range codes {
		s[i] = fmt.Sprintf("0x%02X", c)
	}
	return strings.Join(s, "/")
}

// malformedPanics counts the lines of the gateway's log that mention a
// panic, across everything it has written.
func malformedPanics(g *gateway) int {
	g.log.mu.Lock()
	defer g.log.mu.Unlock()
	return bytes.Count(bytes.ToLower(g.log.buf), []byte("panic"))
}

// TestMalformedReplay replays the corpus against the real gateway: no
// case may crash or restart it, each must be answered as MQTT 5 says
// when the broker answers at all, and a control client must be served
// after every case.
func TestMalformedReplay(t *testing.T) {
	corpus := malformedCorpus()
	rec := relrecord.Begin(t, "malformed", "tcp replay")
	bin := buildGateway(t, t.TempDir())
	g := newGatewayYAML(t, bin, malformedGatewayYAML)
	g.start()
	pid := g.pid()
	goroutines := g.metric("go_goroutines")

	var answered, closed, open, accepted, controlFailed int
	var silent, wrong, deviations []string
	byCode := map[string]int{}
	for i, tc := range corpus {
		a, held := malformedRun(t, g.addr, i, tc)
		spec := "close"
		if len(tc.codes) > 0 {
			spec = malformedCodes(tc.codes)
		}
		t.Logf("%3d %-55s -> %s (spec: %s)", i, tc.name, a, spec)
		valid := len(tc.codes) > 0 && tc.codes[0] == 0 // input that must be accepted
		switch {
		case a.err != nil:
			t.Errorf("case %d %q: reading the answer: %v", i, tc.name, a.err)
		case tc.open:
			open++
			if !a.open || len(a.packets) > 0 {
				t.Errorf("case %d %q: the broker should wait for the rest of the packet; it answered %s", i, tc.name, a)
			}
		case a.code >= 0:
			answered++
			byCode[fmt.Sprintf("%s 0x%02X", a.kind, a.code)]++
			if a.code == 0 && a.kind == "CONNACK" {
				accepted++
			}
			switch {
			case slices.Contains(tc.codes, byte(a.code)):
				if len(tc.deviation) > 0 {
					t.Logf("case %d %q: the broker now answers as MQTT 5 says; delete the case's deviation", i, tc.name)
				}
			case slices.Contains(tc.deviation, byte(a.code)):
				deviations = append(deviations, fmt.Sprintf("%s: %s 0x%02X where MQTT 5 names %s", tc.name, a.kind, a.code, spec))
			default:
				wrong = append(wrong, fmt.Sprintf("%s: %s 0x%02X, spec %s", tc.name, a.kind, a.code, spec))
				t.Errorf("case %d %q (%s): the broker answered %s; MQTT 5 names %s", i, tc.name, tc.why, a, spec)
			}
			if a.code >= 0x80 && a.kind != "SUBACK" && !a.closed {
				t.Errorf("case %d %q: the broker answered %s but did not close the connection [MQTT-4.13.1-1]", i, tc.name, a)
			}
		case !a.closed:
			t.Errorf("case %d %q (%s): the broker neither answered nor closed within %v: %s", i, tc.name, tc.why, malformedAnswerWait, a)
		case valid:
			t.Errorf("case %d %q (%s): valid input was refused: %s", i, tc.name, tc.why, a)
		default:
			closed++
			if len(a.packets) > 0 {
				t.Errorf("case %d %q: the broker sent %s before closing, with no reason code", i, tc.name, a)
			}
			if len(tc.codes) > 0 {
				silent = append(silent, fmt.Sprintf("%s (%s)", tc.name, spec))
			}
		}
		if err := malformedControl(g.addr, i); err != nil {
			controlFailed++
			t.Errorf("case %d %q: the control client was not served afterwards: %v", i, tc.name, err)
		}
		if held != nil {
			held.Close()
		}
		select {
		case <-g.exited:
			rec.Fail("the gateway exited at case %d %q", i, tc.name)
			t.Fatalf("the gateway exited after case %d %q: %v", i, tc.name, g.cmd.ProcessState)
		default:
		}
		if got := g.pid(); got != pid {
			t.Fatalf("the gateway's pid changed from %d to %d at case %d %q", pid, got, i, tc.name)
		}
	}

	// Every hostile connection is closed by now; the broker must have let
	// go of them.
	after := g.metric("go_goroutines")
	for end := time.Now().Add(testkit.Scale(5 * time.Second)); after > goroutines+malformedGoroutineSlack && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
		after = g.metric("go_goroutines")
	}
	if after > goroutines+malformedGoroutineSlack {
		t.Errorf("the gateway runs %.0f goroutines after the replay, %.0f before it: connections were not let go", after, goroutines)
	}
	panics := malformedPanics(g)
	if panics > 0 {
		t.Errorf("the gateway's log mentions a panic %d times", panics)
	}

	codes := make([]string, 0, len(byCode))
	for _, k := range slices.Sorted(maps.Keys(byCode)) {
		codes = append(codes, fmt.Sprintf("%s ×%d", k, byCode[k]))
	}
	rec.Add("cases", "%d", len(corpus))
	rec.Add("answered by reason code", "%d (%s)", answered, strings.Join(codes, ", "))
	rec.Add("accepted (valid input among the cases)", "%d", accepted)
	rec.Add("closed without a packet", "%d", closed)
	rec.Add("left waiting for the rest of a packet", "%d", open)
	rec.Add("closed without the reason code MQTT 5 names", "%d", len(silent))
	rec.Add("answered with a code MQTT 5 does not name", "%d", len(wrong))
	rec.Add("known deviations", "%d", len(deviations))
	rec.Add("control client served after every case", "%s", map[bool]string{true: "yes", false: fmt.Sprintf("no (%d failed)", controlFailed)}[controlFailed == 0])
	rec.Add("goroutines before and after", "%.0f, %.0f", goroutines, after)
	rec.Add("panics", "%d", panics)
	rec.Add("restarts", "0 (pid %d throughout)", pid)
	for _, s := range deviations {
		t.Logf("known deviation: %s", s)
	}
	for _, s := range silent {
		t.Logf("closed without the reason code MQTT 5 names (MAY for CONNECT, SHOULD otherwise, §4.13.1): %s", s)
	}
	if len(wrong) > 0 {
		rec.Fail("answered with a code MQTT 5 does not name: %s", strings.Join(wrong, "; "))
	}
	if controlFailed > 0 {
		rec.Fail("the control client failed after %d cases", controlFailed)
	}
}

// malformedCorpusDir holds the corpus as files; FIELDGATE_MALFORMED_UPDATE=1
// rewrites them from the table.
const malformedCorpusDir = "testdata/malformed"

var malformedUnsafe = regexp.MustCompile(`[^a-z0-9]+`)

// malformedFiles renders the corpus as files: one NNN-name.bin per case
// holding the whole stream a replay sends (the CONNECT a case follows
// included), and MANIFEST.tsv saying how each is sent and what MQTT 5
// says of it.
func malformedFiles() map[string][]byte {
	files := map[string][]byte{}
	var m strings.Builder
	m.WriteString("# The malformed-input corpus of gateway/reliability/malformed_test.go, generated from its table.\n")
	m.WriteString("# Each .bin file is the whole byte stream of one case; send it on a fresh TCP connection.\n")
	m.WriteString("# send: all, drip (a byte at a time), half-close (then shut the write side), open (keep the connection open).\n")
	m.WriteString("# codes: the reason codes MQTT 5 names (in a CONNACK before an accepted CONNECT; after it in a DISCONNECT, or a SUBACK for a refused filter), or close.\n")
	m.WriteString("file\tprotocol\tsend\tcodes\tcase\twhy\n")
	for i, tc := range malformedCorpus() {
		name := fmt.Sprintf("%03d-%s.bin", i, strings.Trim(malformedUnsafe.ReplaceAllString(strings.ToLower(tc.name), "-"), "-"))
		var stream []byte
		if tc.level != 0 {
			stream = malformedPrefix(tc.level, fmt.Sprintf("malformed-%d", i))
		}
		files[name] = append(stream, tc.send...)
		how := "all"
		switch {
		case tc.drip:
			how = "drip"
		case tc.halfClose:
			how = "half-close"
		case tc.open:
			how = "open"
		}
		proto := map[byte]string{0: "first bytes", 4: "after 3.1.1 CONNECT", 5: "after 5.0 CONNECT"}[tc.level]
		codes := "close"
		if len(tc.codes) > 0 {
			codes = malformedCodes(tc.codes)
		}
		fmt.Fprintf(&m, "%s\t%s\t%s\t%s\t%s\t%s\n", name, proto, how, codes, tc.name, tc.why)
	}
	files["MANIFEST.tsv"] = []byte(m.String())
	return files
}

// TestMalformedCorpusFiles keeps testdata/malformed in step with the table.
func TestMalformedCorpusFiles(t *testing.T) {
	want := malformedFiles()
	if os.Getenv("FIELDGATE_MALFORMED_UPDATE") == "1" {
		if err := os.RemoveAll(malformedCorpusDir); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(malformedCorpusDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range want {
			if err := os.WriteFile(filepath.Join(malformedCorpusDir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	entries, err := os.ReadDir(malformedCorpusDir)
	if err != nil {
		t.Fatalf("%v; write the corpus with FIELDGATE_MALFORMED_UPDATE=1 go test -run MalformedCorpusFiles ./gateway/reliability", err)
	}
	have := map[string]bool{}
	for _, e := range entries {
		have[e.Name()] = true
		b, ok := want[e.Name()]
		if !ok {
			t.Errorf("%s/%s is not in the corpus table", malformedCorpusDir, e.Name())
			continue
		}
		got, err := os.ReadFile(filepath.Join(malformedCorpusDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Errorf("%s/%s differs from the corpus table", malformedCorpusDir, e.Name())
		}
	}
	for name := range want {
		if !have[name] {
			t.Errorf("%s/%s is missing", malformedCorpusDir, name)
		}
	}
	if t.Failed() {
		t.Log("rewrite the files with FIELDGATE_MALFORMED_UPDATE=1 go test -run MalformedCorpusFiles ./gateway/reliability")
	}
}
