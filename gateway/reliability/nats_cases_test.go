package reliability

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/natscluster"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TestBridgeNATS runs the bridge-nats cases against one cluster, the
// gateway built once: what NATS refuses (MQTT 5, QoS 2 publishes, a topic
// with a space) and, last since it kills the cluster's nodes, a fleet of
// gateways through faults of the cluster, of the gateways and of their
// links.
func TestBridgeNATS(t *testing.T) {
	w := newNATSWorld(t)
	t.Run("Negotiation", func(t *testing.T) { natsNegotiation(t, w) })
	t.Run("QoS2Refused", func(t *testing.T) { natsQoS2Refused(t, w) })
	t.Run("RefusedTopic", func(t *testing.T) {
		t.Run("DeadLetter", func(t *testing.T) { natsRefusedTopic(t, w, false) })
		t.Run("TopicRules", func(t *testing.T) { natsRefusedTopic(t, w, true) })
	})
	t.Run("Fleet", func(t *testing.T) { natsFleet(t, w) })
	if err := w.reader.Err(); err != nil {
		t.Errorf("the stream's reader: %v", err)
	}
	for _, p := range w.stream.tallyProblems() {
		t.Errorf("the stream's reader: %s", p)
	}
}

// natsLoadRate is the load of each gateway in the cases but the fleet,
// in messages a second.
const natsLoadRate = 50

// natsLoadFor is how long those cases keep the load on past their fault.
var natsLoadFor = relrecord.Pick(3*time.Second, 20*time.Second)

// natsNegotiation: the bridge, protocol auto, dials NATS with MQTT 5,
// which NATS refuses with the 3.1.1 return code 1, and connects with
// 3.1.1. After a link drop (the proxy between them cuts it) it must dial
// 3.1.1 at once: NATS logs each MQTT 5 CONNECT it refuses, and over the
// whole case it must log one.
func natsNegotiation(t *testing.T, w *natsWorld) {
	c := newNATSCase(t, "MQTT 3.1.1 negotiation")
	before := w.cluster.CountLog(natscluster.MQTT5Refusal)
	ng := w.startGateway(t, "nego", w.cluster.Node(0), true, natsBridgeOpts{}, natsLoadRate)
	w.awaitFirst(t, ng)
	first := w.cluster.CountLog(natscluster.MQTT5Refusal) - before
	if first != 1 {
		c.fail("NATS logged %d MQTT 5 refusals for the bridge's first connection; protocol auto should try MQTT 5 once", first)
	}
	drops := relrecord.Pick(2, 5)
	for range drops {
		r0 := ng.reconnects(t)
		ng.proxy.Cut()
		testkit.WaitFor(t, natsDrain, "the bridge to connect again after its link was cut", func() bool {
			return ng.reconnects(t) > r0
		})
		// Something published after the cut is carried: the link
		// works at the protocol it chose.
		target := ng.pub.ledger().published + 1
		testkit.WaitFor(t, natsDrain, fmt.Sprintf("message %d in the stream", target), func() bool {
			return w.stream.stored(ng.device) >= target
		})
	}
	links := ng.reconnects(t)
	refusals := w.cluster.CountLog(natscluster.MQTT5Refusal) - before
	version := ng.series(t, "fieldgate_bridge_protocol_version", "}")
	c.add("MQTT 5 CONNECTs refused by NATS", "%d", refusals)
	c.add("connections", "%.0f, %d of them after the proxy cut the link", links, drops)
	c.add("protocol level on /metrics", "%.0f", version)
	if refusals != 1 {
		c.fail("NATS refused %d MQTT 5 CONNECTs over %.0f connections: the bridge tried MQTT 5 again after a link drop instead of remembering that this upstream speaks 3.1.1",
			refusals, links)
	}
	if version != 4 {
		c.fail("fieldgate_bridge_protocol_version is %.0f on a link to NATS, which speaks only 3.1.1 (4)", version)
	}
	c.add("drain", "%s", c.drain(w, []*natsGateway{ng}).Round(time.Millisecond))
	c.counted(c.check(w, ng))
}

// natsLearnedLinks bounds the connections a bridge may make while it
// learns that its upstream refuses what it sends (QoS 2 publishes here):
// the first, refused, and a few more before the refusal counts as one
// that will not pass; every link after those must hold.
const natsLearnedLinks = 5

// natsStormBound is the most connections the bridge's backoff allows in
// d, however unlucky its draws: a wait of at least its floor of 100 ms
// (gateway/bridge's backoffFloor) before each one after the first. A
// bridge that redials at once, as it did on links the server closes
// right after CONNACK, passes it within a second.
func natsStormBound(d time.Duration) float64 {
	return 1 + float64(d/(100*time.Millisecond))
}

// noStorm keeps the load on for natsLoadFor, and ends the case as soon as
// the bridge has made more connections since it had made r0 (when, says
// what) than its backoff allows.
func (c *natsCase) noStorm(ng *natsGateway, r0 float64, when string) {
	c.t.Helper()
	began := time.Now()
	for time.Since(began) < natsLoadFor {
		d := time.Since(began)
		if n := ng.reconnects(c.t) - r0; n > natsStormBound(d) {
			c.fatal("a reconnect storm %s: %.0f connections in %s, more than the backoff allows (%.0f)",
				when, n, d.Round(time.Millisecond), natsStormBound(d))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// natsQoS2Refused: a QoS 2 out-route to NATS with reject_qos2_publish,
// which closes the connection on a QoS 2 PUBLISH. The bridge must not
// redial in a storm, must carry the route at QoS 1 instead once it has
// learned the refusal, warn once about that, and deliver every message.
func natsQoS2Refused(t *testing.T, w *natsWorld) {
	c := newNATSCase(t, "QoS 2 route against reject_qos2_publish")
	ng := w.startGateway(t, "qos2", w.cluster.Node(1), false, natsBridgeOpts{qos: 2}, natsLoadRate)
	began := time.Now()
	// The metric starts with the process: every connection counts.
	c.noStorm(ng, 0, "since the gateway started")
	drain := c.drain(w, []*natsGateway{ng})
	links := ng.reconnects(t)
	limit := ng.series(t, "fieldgate_bridge_qos_limit", "}")
	c.add("connections", "%.0f in %s", links, time.Since(began).Round(time.Second))
	c.add("QoS limit on /metrics", "%.0f", limit)
	c.add("drain", "%s", drain.Round(time.Millisecond))
	if links > natsLearnedLinks {
		c.fail("%.0f connections over the case: the bridge did not learn that NATS refuses QoS 2 publishes (at most %d while it learns)",
			links, natsLearnedLinks)
	}
	if limit != 1 {
		c.fail("fieldgate_bridge_qos_limit is %.0f; the bridge should show the QoS 1 it learned", limit)
	}
	warnings := natsWarnings(ng.g, "QoS 1")
	c.add("warnings of QoS 1", "%d", len(warnings))
	if len(warnings) != 1 {
		c.fail("the gateway logged %d warnings that the route goes at QoS 1, want one: %q", len(warnings), warnings)
	}
	c.counted(c.check(w, ng))
}

// natsWarnings returns the gateway's WARN lines that mention text.
func natsWarnings(g *gateway, text string) []string {
	var out []string
	for _, l := range strings.Split(g.log.lines(1<<20), "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, text) {
			out = append(out, l)
		}
	}
	return out
}

// natsDeadLetters is the gauge of a bridge's dead letters on /metrics.
const natsDeadLetters = "fieldgate_bridge_dead_letters"

// natsRefusedTopic: a local QoS 1 publish to fieldgate/{device}/bad
// topic, valid MQTT that NATS refuses (a space makes no NATS subject) by
// closing the connection, among the load. Without topic rules, the bridge
// must move it to the dead letters after a few failed links, and go on
// with the messages behind it; with the nats preset of topic_rules, the
// route refuses it before the outbox and the link never fails. Either
// way, every acknowledged message of the load arrives.
func natsRefusedTopic(t *testing.T, w *natsWorld, rules bool) {
	name, device, opts := "refused topic, dead letter", "deadletter", natsBridgeOpts{}
	if rules {
		name, device, opts = "refused topic, nats topic rules", "rules", natsBridgeOpts{topicRules: "nats"}
	}
	c := newNATSCase(t, name)
	ng := w.startGateway(t, device, w.cluster.Node(2), false, opts, natsLoadRate)
	w.awaitFirst(t, ng)
	r0 := ng.reconnects(t)
	bad := "fieldgate/" + device + "/bad topic"
	code := natsPublishOnce(t, ng.g.addr, device+"-bad", bad)
	c.noStorm(ng, r0, "after the bad publish")
	drain := c.drain(w, []*natsGateway{ng})
	relinks := ng.reconnects(t) - r0
	dead := ng.series(t, natsDeadLetters, "}")
	refused := ng.series(t, "fieldgate_bridge_messages_dropped_total", `,reason="topic_rules"}`)
	if rules {
		c.add("refused at the route", "%.0f", refused)
	}
	c.add("dead letters", "%.0f", dead)
	c.add("the gateway's answer to the bad publish", "0x%02X", code)
	c.add("connections after the bad publish", "%.0f", relinks)
	c.add("drain", "%s", drain.Round(time.Millisecond))
	if rules {
		if code < 0x80 {
			c.fail("the gateway acknowledged the bad publish with 0x%02X: its MQTT 5 publisher was not told the route refused it", code)
		}
		if refused != 1 {
			c.fail("%.0f messages refused by the topic rules on /metrics, want 1", refused)
		}
		if relinks != 0 {
			c.fail("the link dropped %.0f times after the bad publish: the topic rules let it through to NATS", relinks)
		}
		if dead != 0 {
			c.fail("%.0f dead letters: the topic rules should have refused the message before the outbox", dead)
		}
	} else if dead != 1 {
		c.fail("%.0f dead letters after NATS refused one message, want 1", dead)
	}
	// Never dropped silently: the log names the topic.
	if len(natsWarnings(ng.g, strconv.Quote(bad))) == 0 {
		c.fail("no warning in the gateway's log names %q", bad)
	}
	if n := w.stream.other(bad); n != 0 {
		c.fail("NATS stored %d messages on %q, a topic it refuses: the case tests the wrong thing", n, bad)
	}
	c.counted(c.check(w, ng))
}

// natsPublishOnce publishes one QoS 1 message on topic to the gateway at
// addr and returns the reason code of its PUBACK.
func natsPublishOnce(t *testing.T, addr, id, topic string) byte {
	t.Helper()
	cl, _, err := dial(addr, id, true, 0, 0)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	defer cl.disconnect()
	if err := cl.publish(topic, "bad", 1, 1, false); err != nil {
		t.Fatalf("%s: publishing to %q: %v", id, topic, err)
	}
	pk, err := cl.read(ioTimeout)
	if err != nil {
		t.Fatalf("%s: waiting for the PUBACK of %q: %v", id, topic, err)
	}
	if pk.FixedHeader.Type != packets.Puback || pk.PacketID != 1 {
		t.Fatalf("%s: %s for packet id %d, want the PUBACK of 1", id, packetName(pk), pk.PacketID)
	}
	return pk.ReasonCode
}
