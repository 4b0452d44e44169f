// Package bridge carries messages between the local broker and a cloud
// broker: out-routes up through a durable outbox, in-routes back down to
// local subscribers, over one upstream connection per bridge with our own
// MQTT client (package mqttclient) on mochi's packets codec.
//
// The contract:
//
//   - A local message matching an out-route is in the outbox, in the same
//     storage batch as the publish's other effects, before its publisher
//     is acknowledged (Offer, called by the broker); it is deleted only
//     after the upstream's PUBACK (QoS 1) or PUBCOMP (QoS 2). A crash
//     between the two sends it again: a duplicate, never a loss.
//   - Replay keeps the order of each route, never has more in flight than
//     the server's Receive Maximum (or max_inflight), and is paced to rate
//     messages a second.
//   - A full outbox drops its oldest telemetry, refuses new alarms (0x97 to
//     an MQTT 5 publisher) and never drops one, and keeps only the latest
//     message per topic of a state route; every drop is counted by reason.
//   - A topic an out-route makes that breaks the upstream's topic rules
//     (topic_rules) is refused before the outbox, never queued, so it
//     cannot block the uplink; an MQTT 5 publisher is told (0x90), and
//     every refusal is counted and logged, at most once a minute per topic.
//   - A message the upstream keeps refusing is moved to the bridge's dead
//     letters in the state file, in one batch with its outbox delete, so
//     that the uplink goes on behind it; dead letters are counted, logged
//     with their topic and the server's reason, bounded by
//     max_dead_letter_bytes (the oldest dropped, counted and logged), and
//     retried or dropped by a person (RetryDeadLetters, DropDeadLetters).
//   - A message is moved there when the server ended dead_letter_after
//     links in a row on it, the last of them sending it alone after a
//     PINGRESP (suspect.go): a healthy message is never blamed for the one
//     behind it, and links our side closes or finds silent blame none.
//   - A link that goes quiet (no PINGRESP or acknowledgement within
//     ack_timeout) is replaced; reconnects back off exponentially with
//     full jitter, and every attempt that delivers nothing (a refused
//     dial, a link closed before an acknowledgement or a keep alive
//     interval) counts as a failure; the log says why once per change.
//   - What the upstream refuses is learned until a reload changes the
//     link: the 3.1.1 fallback, its Maximum QoS, a QoS 2 it closes links
//     on (learned.go).
//   - With nothing to send, nothing ticks faster than the watchdog's once
//     a second.
//   - Overlapping in-route filters get subscription identifiers derived
//     from the filter, stable across restarts; what the bridge published
//     locally from the upstream is never offered back out.
package bridge
