package bridge

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
	"github.com/fieldgate/fieldgate/storage"
)

// What a bridge learns of its upstream, rather than fail on again and
// again:
//
//   - The protocol. With protocol auto, a server that refuses MQTT 5 (a
//     3.1.1 CONNACK with return code 1, or the connection closed after an
//     MQTT 5 CONNECT) is dialled with 3.1.1 from then on: NATS, for one,
//     logs an error for every MQTT 5 CONNECT it refuses.
//   - The server's Maximum QoS (MQTT 5): the client lowers what goes above
//     it on its own; the bridge says which routes that touches, once.
//   - A refused QoS 2. MQTT 3.1.1 has no Maximum QoS, and a server that
//     takes no QoS 2 (NATS with reject_qos2_publish, Mosquitto with
//     max_qos 1) closes the link on a QoS 2 PUBLISH. When it does so on a
//     QoS 2 message sent alone (a probe, see suspect.go), and no QoS 2
//     message ever got a PUBREC from it, the bridge's QoS 2 routes go at
//     QoS 1 to it, with one warning. Exactly once cannot be claimed for
//     a message sent at QoS 1 at all; for the suspect, the server never
//     took it. The QoS 2 flight records of what is not past PUBREC are
//     deleted, durably, before any of it goes at QoS 1.
//
// All of it is forgotten when a reload changes the link's settings: the
// reload may point at another server, or fix what made this one refuse.

// learned is what the upstream showed it does not take. It lives under
// shared.mu.
type learned struct {
	protocol    byte // 4: the server refused MQTT 5 (protocol auto); 0: nothing learned
	maxQoS      byte // the server's Maximum QoS, when known
	maxQoSKnown bool
	qos2Refused bool // the server closed the link on a QoS 2 message alone
	qos2Taken   bool // a QoS 2 message got a PUBREC from it: it takes QoS 2
}

// limit returns the highest QoS the bridge sends the upstream.
func (l *learned) limit() byte {
	q := byte(2)
	if l.maxQoSKnown {
		q = min(q, l.maxQoS)
	}
	if l.qos2Refused {
		q = min(q, 1)
	}
	return q
}

// learnt is what a new link taught, to log once shared.mu is released.
type learnt struct {
	fellBack bool   // the server refused MQTT 5 for the first time
	maxQoS   byte   // the server's Maximum QoS, new
	routes   string // the routes above it, when it is new
}

// learnLinkLocked takes in what a new link's CONNACK says: the protocol
// a fallback found, and the server's Maximum QoS. It sets loop.maxQoS for
// the link. The caller holds shared.mu, under which a reload forgets what
// was learned, and logs what it returns.
func (b *Bridge) learnLinkLocked(opts mqttclient.Options, c *mqttclient.Client) learnt {
	info := c.Info()
	l := &b.shared.learned
	var out learnt
	if opts.Protocol == 0 && info.Version == 4 && l.protocol == 0 {
		l.protocol, out.fellBack = 4, true
	}
	if info.MaxQoS < 2 && (!l.maxQoSKnown || l.maxQoS != info.MaxQoS) {
		out.maxQoS, out.routes = info.MaxQoS, routesAbove(b.rt.Load(), info.MaxQoS)
	}
	l.maxQoS, l.maxQoSKnown = info.MaxQoS, true
	b.loop.maxQoS = l.limit()
	return out
}

// log says what a link taught, once per upstream.
func (l learnt) log(b *Bridge) {
	if l.fellBack {
		b.log.Info("upstream refused MQTT 5; this bridge connects with MQTT 3.1.1 from now on", "address", b.rt.Load().cfg.Address)
	}
	if l.routes != "" {
		b.log.Warn("upstream's Maximum QoS is lower than routes ask; their messages go at that QoS", "max_qos", l.maxQoS, "routes", l.routes)
	}
}

// routesAbove names the out-routes whose QoS is above q.
func routesAbove(rt *routing, q byte) string {
	var names []string
	for _, r := range rt.outs {
		if byte(r.QoS) > q {
			names = append(names, fmt.Sprintf("out[%d] %s (qos %d)", r.index, r.Filter, r.QoS))
		}
	}
	return strings.Join(names, ", ")
}

// onPubrec is the client's OnPubrec: the PUBREL for pid waits until the
// send loop has recorded that the server received the message. The
// server takes QoS 2, then.
func (b *Bridge) onPubrec(pid uint16) {
	b.shared.mu.Lock()
	b.shared.learned.qos2Taken = true
	b.shared.mu.Unlock()
	b.flights.pubrec(pid)
	b.ob.signal()
}

// learnQoS2Refused takes a link that ended with err while probing entry
// e, sent at loop.maxQoS, as the server refusing QoS 2 when it is: a
// 3.1.1 server that closed the link (or an MQTT 5 one that said QoS not
// supported), on a QoS 2 message, with no QoS 2 message ever received.
// It lowers the QoS 2 routes to QoS 1 for this upstream, deleting the
// QoS 2 records of what is not past PUBREC first, and reports whether it
// did.
func (b *Bridge) learnQoS2Refused(version byte, e *storage.OutboxEntry, err error) bool {
	var de *mqttclient.DisconnectError
	if e.Msg.QoS < 2 || b.loop.maxQoS < 2 || !(version == 4 || errors.As(err, &de) && de.Code == packets.ErrQosNotSupported.Code) {
		return false
	}
	b.shared.mu.Lock()
	taken := b.shared.learned.qos2Taken
	b.shared.mu.Unlock()
	if taken {
		return false
	}
	if db := b.opts.Store; db != nil {
		seqs := b.flights.unreceived()
		var batch storage.Batch
		for _, seq := range seqs {
			batch.OutboxFlightDelete(b.name, seq)
		}
		if err := db.CommitWait(&batch); err != nil {
			// The records stay, and so does QoS 2, until the next
			// failure on the probe tries again.
			b.recordFailed("deleting the QoS 2 records of messages to send at QoS 1 failed; QoS 2 stays for now", err)
			return false
		}
		b.flights.unrecord(seqs)
	}
	b.shared.mu.Lock()
	b.shared.learned.qos2Refused = true
	b.shared.mu.Unlock()
	b.loop.maxQoS = min(b.loop.maxQoS, 1)
	b.log.Warn("upstream closed the link on a QoS 2 message sent alone and has taken none; QoS 2 routes go at QoS 1 to it from now on (at least once, not exactly once)",
		"address", b.rt.Load().cfg.Address, "topic", e.Msg.Topic, "err", err, "routes", routesAbove(b.rt.Load(), 1))
	return true
}
