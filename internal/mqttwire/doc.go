// Package mqttwire is the one strict MQTT packet reader and writer shared
// by the broker, the bridge's upstream client, the tests and the bench
// module. mochi-mqtt's packets codec encodes and decodes the fields of a
// packet; mqttwire owns the framing around it and the rules the codec
// leaves out of it.
//
// Reading: ReadPacket (or ReadHeader and ReadBody, for a reader that waits
// for a packet's first byte itself) takes one packet off a stream. It
// checks the fixed header's flags [MQTT-2.1.3-1], refuses a remaining
// length longer than four bytes [MQTT-1.5.5-1] and a packet above the
// reader's limit [MQTT-3.2.2-15] [MQTT-3.1.2-24], and grows the body as
// its bytes arrive, so that a peer announcing a large packet pins only
// what it has sent. A broken packet is an *Error carrying the MQTT 5
// reason code the connection ends with; anything else is the stream's own
// error, with an end of stream inside a packet as io.ErrUnexpectedEOF.
// Decode runs the codec's decoder for the packet's type and turns its
// panics on truncated input into an *Error.
//
// Writing: AppendHeader frames a body, AppendVarint and Varint are the
// variable byte integer (§1.5.5), Ack and AppendAck encode the four
// acknowledgements, and Encode runs the codec's encoder for any other
// packet. PacketName and ReasonName name packet types and reason codes
// for messages.
package mqttwire
