// Package mqttclient is the bridge's upstream MQTT client: one connection
// from the gateway to the cloud broker, MQTT 5 with a fallback to 3.1.1,
// framed and checked by internal/mqttwire, the reader and writer the
// embedded broker uses, on mochi's packets codec. A Client is one
// connection, not a session manager: when it ends, the bridge dials a new
// one (spaced by its backoff) and resends what was not acknowledged.
//
// Three goroutines serve a connection. The reader decodes what the server
// sends, runs OnMessage and answers it; the writer drains a byte-bounded
// queue into the socket, so that a full queue makes callers wait rather
// than grow memory; the watchdog sends PINGREQ when nothing was sent for a
// keep alive period and ends the connection with ErrHalfOpen when an
// acknowledgement is overdue. The reader owns the end of the connection:
// it stops the other two, waits for them, and reports the connection's
// error to every callback still waiting. A packet that breaks the protocol
// is an *mqttwire.Error; on MQTT 5 the client tells the server its reason
// code in a DISCONNECT before closing.
//
// The files follow those concerns: options.go and errors.go the API's
// edges, handshake.go CONNECT and CONNACK, client.go the calls, ids.go the
// packet identifiers, writer.go the write queue, watchdog.go the keep
// alive and overdue acknowledgements, reader.go what the server sends,
// codec.go what the client adds to mqttwire.
package mqttclient
