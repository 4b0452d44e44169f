// Package broker is fieldgate's embedded MQTT server: MQTT 3.1.1 and 5.0 on
// one port, over TCP, TLS, WebSocket and unix sockets, routing through
// matcher's compact index.
//
// It keeps what mochi-mqtt does well, the packet codec (packets) and the
// listeners, and owns the part that decides memory and speed: connections,
// sessions, QoS flows and routing.
//
// The contract:
//
//   - Each connection has one reader and one writer goroutine. What waits
//     to be written, and the QoS 1/2 messages waiting for a client's window,
//     are bounded in bytes per client (broker.max_queued_bytes). Past the
//     budget a client loses QoS 0 messages, and QoS 1/2 messages it has not
//     room for are dropped and counted; a client whose window stalls past
//     broker.inflight_timeout is disconnected. No client can stall a
//     publisher or another subscriber.
//   - A PUBLISH is encoded once per wire variant (protocol version, QoS,
//     retain flag) and those bytes are shared by every subscriber; only the
//     packet identifier and DUP flag differ, and the writer sets them as it
//     copies. Receivers that need their own form (subscription identifiers,
//     topic aliases, a message expiry to count down) get it encoded for
//     them.
//   - A QoS 1/2 PUBLISH is acknowledged after it has been routed: every
//     matching session has it queued, in flight, or counted as dropped.
//   - No input crashes the broker: a malformed packet closes its connection
//     with the reason code MQTT 5 asks for, and decoding runs under recover.
//
// Sessions and retained messages live in memory in this package; the
// storage package makes them durable.
package broker
