package reliability

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
	"github.com/fieldgate/fieldgate/internal/testkit/pahotest"
)

// TestBridgeTopicRules runs the gateway with a bridge that declares its
// upstream's topic rules (the nats preset: no whitespace) and an
// out-route for AWS IoT shadow topics, against a real Mosquitto. A topic
// the rules forbid is refused at the route: the MQTT 5 publisher gets
// 0x90 (and a refused QoS 2 flow ends there, its packet identifier free
// for the next message), local subscribers still get it, the upstream
// never does, /metrics counts it, and the log names it once a minute.
// A $aws topic published locally reaches the upstream.
func TestBridgeTopicRules(t *testing.T) {
	rec := relrecord.Begin(t, "bridge", "upstream topic rules, $ topics")
	bin := buildGateway(t, t.TempDir())
	up := mosquitto.Start(t, mosquitto.Config{})
	cloud := pahotest.WatchV311(t, up.Addr(), "cloud-app", "site/#", 1)
	shadow := pahotest.WatchV311(t, up.Addr(), "cloud-shadow", "$aws/#", 1)
	g := newGatewayYAML(t, bin, plainYAML("")+fmt.Sprintf(`bridges:
  - name: cloud
    address: %q
    reconnect_min: 100ms
    reconnect_max: 500ms
    topic_rules: {preset: nats}
    out:
      - {filter: "site/#"}
      - {filter: "$aws/things/+/shadow/#"}
`, up.Addr()))
	g.start()
	g.awaitLog("upstream connected")

	sub, _, err := dial(g.addr, "local-app", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.close()
	if err := sub.subscribe("site/#", 1); err != nil {
		t.Fatal(err)
	}
	pub, _, err := dial(g.addr, "device", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.close()
	expect := func(kind byte, pid uint16, code byte) {
		t.Helper()
		pk, err := pub.read(ioTimeout)
		if err != nil {
			t.Fatalf("waiting for %s %d: %v", packets.PacketNames[kind], pid, err)
		}
		if pk.FixedHeader.Type != kind || pk.PacketID != pid || pk.ReasonCode != code {
			t.Errorf("got %s id %d reason 0x%02X (%q), want %s id %d reason 0x%02X", packetName(pk), pk.PacketID, pk.ReasonCode,
				pk.Properties.ReasonString, packets.PacketNames[kind], pid, code)
			rec.Fail("%s %d answered 0x%02X, want 0x%02X", packets.PacketNames[kind], pid, pk.ReasonCode, code)
		}
	}
	local := func(topic string) {
		t.Helper()
		pk, err := sub.read(ioTimeout)
		if err != nil || pk.FixedHeader.Type != packets.Publish || pk.TopicName != topic {
			t.Fatalf("the local subscriber got %v (%v), want %s", pk, err, topic)
		}
		if pk.FixedHeader.Qos > 0 {
			_ = sub.ack(packets.Puback, pk.PacketID)
		}
	}
	// publish sends topic at qos under pid, expects its PUBACK or PUBREC
	// with code (and completes a QoS 2 flow that code 0 goes on with),
	// and that the local subscriber to site/# got it.
	publish := func(topic string, qos byte, pid uint16, code byte) {
		t.Helper()
		if err := pub.publish(topic, "x", qos, pid, false); err != nil {
			t.Fatal(err)
		}
		if qos == 1 {
			expect(packets.Puback, pid, code)
		} else {
			expect(packets.Pubrec, pid, code)
			if code == 0 {
				_ = pub.ack(packets.Pubrel, pid)
				expect(packets.Pubcomp, pid, 0)
			}
		}
		if strings.HasPrefix(topic, "site/") {
			local(topic)
		}
	}

	publish("site/gw/bad topic", 1, 1, 0x90)
	publish("site/gw/bad topic", 2, 2, 0x90)
	publish("site/gw/next", 2, 2, 0) // the same identifier: a new message
	publish("$aws/things/gw/shadow/update", 1, 3, 0)
	publish("site/gw/other bad", 1, 4, 0x90)
	publish("site/gw/end", 1, 5, 0)

	// What the upstream got, in order: the good topics only.
	for _, want := range []string{"site/gw/next", "site/gw/end"} {
		if m := cloud.Next(t); m.Topic() != want {
			t.Errorf("upstream got %q, want %q", m.Topic(), want)
			rec.Fail("upstream got %q", m.Topic())
		}
	}
	if m := shadow.Next(t); m.Topic() != "$aws/things/gw/shadow/update" {
		t.Errorf("upstream shadow topic %q", m.Topic())
	}

	// Counted and logged: each topic once within the minute, the second
	// line saying one refusal went unlogged before it.
	name := `fieldgate_bridge_messages_dropped_total{bridge="cloud",reason="topic_rules"}`
	testkit.WaitFor(t, ioTimeout, "the refusals counted in /metrics", func() bool { return g.metric(name) == 3 })
	g.awaitLog(`topic="site/gw/other bad"`)
	log := g.log.lines(1 << 20)
	if n := strings.Count(log, `topic="site/gw/bad topic"`); n != 1 {
		t.Errorf("%d log lines for two refusals of one topic within a minute, want 1", n)
		rec.Fail("%d log lines for one refused topic", n)
	}
	if !strings.Contains(log, "unlogged_since_last=1") {
		t.Error("the second refusal line does not count the unlogged one")
	}
	rec.Add("refused at the route", "3 publishes (QoS 1 and 2): 0x90 to the publisher, delivered locally, never upstream")
	rec.Add("dropped (topic_rules) in /metrics", "%.0f", g.metric(name))
	rec.Add("$aws topic upstream", "yes")
	g.stop()
}
