package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fieldgate/fieldgate/storage"
)

// Topics beginning with '$': only $SYS is the broker's. The others are
// the clients', as Mosquitto has them, so that a local application can
// publish AWS IoT's $aws/things/{thing}/shadow/update or Azure's
// $iothub/... for a bridge to carry upstream; like every $ topic, no
// filter beginning with a wildcard matches them [MQTT-4.7.2-1].

// TestDollarTopics: over MQTT 3.1.1 and 5, at QoS 0, 1 and 2, a publish to
// a $aws topic is acknowledged and reaches a subscriber to $aws/#, and
// not one to # or +/things/#; a will on one goes out too.
func TestDollarTopics(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	dollar, _ := connectRaw(t, tb.Addr, 5, "dollar", true, nil)
	dollar.subscribe(1, packets.Subscription{Filter: "$aws/#", Qos: 2})
	wild, _ := connectRaw(t, tb.Addr, 5, "wild", true, nil)
	wild.subscribe(1, packets.Subscription{Filter: "#", Qos: 2}, packets.Subscription{Filter: "+/things/#", Qos: 2})
	for _, version := range []byte{4, 5} {
		pub, _ := connectRaw(t, tb.Addr, version, fmt.Sprintf("pub-v%d", version), true, nil)
		for qos := byte(0); qos <= 2; qos++ {
			topic := fmt.Sprintf("$aws/things/gw-v%d-q%d/shadow/update", version, qos)
			pub.publish(rawPublish(topic, `{"state":{}}`, qos, false, 1)) // acknowledged with 0
			dollar.ackPublish(dollar.expectPublish(topic, `{"state":{}}`, qos))
		}
		pub.close()
	}

	// A real 3.1.1 client's will on a $ topic.
	cut, _ := v3Connect(t, tb.Addr, "will-cut", func(o *mqtt.ClientOptions) {
		o.SetWill("$aws/things/will-cut/shadow/update", `{"state":{"reported":{"online":false}}}`, 1, false)
	})
	cut.cut(t)
	dollar.ackPublish(dollar.expectPublish("$aws/things/will-cut/shadow/update", `{"state":{"reported":{"online":false}}}`, 1))
	wild.quiet()
}

// TestSysTopicsRefused: $SYS stays the broker's. A publish there is
// delivered to nobody: MQTT 5 refuses it with 0x87, 3.1.1, which has no
// code for it, is acknowledged as before; a will there refuses the
// CONNECT; an in-process client gets ErrSysTopic. A topic that merely
// begins with the same letters is not $SYS.
func TestSysTopicsRefused(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	sys, _ := connectRaw(t, tb.Addr, 5, "sys", true, nil)
	sys.subscribe(1, packets.Subscription{Filter: "$SYS/#", Qos: 2}, packets.Subscription{Filter: "$SYSTEM/#", Qos: 2})

	v5, _ := connectRaw(t, tb.Addr, 5, "v5", true, nil)
	v5.send(rawPublish("$SYS/broker/uptime", "forged", 1, false, 1))
	v5.expectAck(packets.Puback, 1, rcNotAuthorized)
	v5.send(rawPublish("$SYS", "forged", 2, false, 2))
	v5.expectAck(packets.Pubrec, 2, rcNotAuthorized)
	v5.send(rawPublish("$SYS/x", "forged", 0, true, 0))
	v5.ping()
	v3, _ := connectRaw(t, tb.Addr, 4, "v3", true, nil)
	v3.publish(rawPublish("$SYS/broker/version", "forged", 1, false, 1))
	v3.send(rawPublish("$SYS/x", "forged", 2, true, 2))
	v3.expectAck(packets.Pubrec, 2, 0)
	v3.send(rawAck(packets.Pubrel, 2, 0))
	v3.expect(packets.Pubcomp)

	willer := dialRaw(t, tb.Addr, 5)
	pk := willer.connectPacket("willer", true)
	pk.Connect.WillFlag, pk.Connect.WillTopic, pk.Connect.WillPayload = true, "$SYS/broker/uptime", []byte("forged")
	if ack := willer.connect(pk); ack.ReasonCode != rcNotAuthorized {
		t.Errorf("a will on $SYS: CONNACK %s, want 0x87", rawDescribe(ack))
	}

	cl, err := tb.Connect("in-process")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, topic := range []string{"$SYS", "$SYS/broker/uptime"} {
		if err := cl.Publish(context.Background(), topic, []byte("forged"), 0, false); !errors.Is(err, ErrSysTopic) {
			t.Errorf("in-process publish to %s: %v, want ErrSysTopic", topic, err)
		}
	}
	if err := cl.Publish(context.Background(), "$SYSTEM/x", []byte("ok"), 1, false); err != nil {
		t.Errorf("in-process publish to $SYSTEM/x: %v", err)
	}
	sys.ackPublish(sys.expectPublish("$SYSTEM/x", "ok", 1))
	if !tb.CanPublish("", "$aws/things/t/shadow/update") || tb.CanPublish("", "$SYS/x") {
		t.Error("CanPublish: want $aws allowed and $SYS refused")
	}
	sys.quiet()
}

// TestDollarTopicsInProcess: an in-process client, such as a sensor or a
// bridge, publishes and subscribes to $ topics like a network client.
func TestDollarTopicsInProcess(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	cl, err := tb.Connect("app")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := make(chan string, 4)
	if err := cl.Subscribe("$iothub/#", 1, func(m Message) { got <- m.Topic }); err != nil {
		t.Fatal(err)
	}
	wild, _ := connectRaw(t, tb.Addr, 5, "wild", true, nil)
	wild.subscribe(1, packets.Subscription{Filter: "#", Qos: 1})
	topic := "$iothub/twin/PATCH/properties/reported/?$rid=1"
	if err := cl.Publish(context.Background(), topic, []byte(`{"fw":"1.2"}`), 1, false); err != nil {
		t.Fatalf("in-process publish to %s: %v", topic, err)
	}
	if g := <-got; g != topic {
		t.Errorf("in-process subscriber got %q, want %q", g, topic)
	}
	wild.quiet()
}

// TestDollarTopicsRetained: a retained message on a $ topic is kept in the
// state file across a restart, goes to a new subscription whose filter
// begins with its own first level and not to one to #, and counts against
// the retained bounds like any other.
func TestDollarTopicsRetained(t *testing.T) {
	t.Parallel()
	sb := newStoredBroker(t, func(o *Options) { o.MaxRetainedPerUser = 2 })
	alice, _ := connectRaw(t, sb.tb.Addr, 5, "alice", true, asUser("alice", 0))
	alice.publish(rawPublish("$aws/things/t1/shadow/update", "one", 1, true, 1))
	alice.publish(rawPublish("plain/t1", "two", 2, true, 2))
	alice.send(rawPublish("$aws/things/t2/shadow/update", "three", 1, true, 3))
	alice.expectAck(packets.Puback, 3, rcQuotaExceeded) // alice's third
	alice.close()
	if st := sb.tb.Stats(); st.RetainedCounted != 2 || st.Refusals[refusedRetainedPerUser] != 1 {
		t.Errorf("before the restart: %d retained counted, refusals %v; want 2 and one per-user refusal", st.RetainedCounted, st.Refusals)
	}

	sb.restart()
	if st := sb.tb.Stats(); st.RetainedCounted != 2 {
		t.Errorf("after the restart: %d retained counted, want 2", st.RetainedCounted)
	}
	if m, err := sb.db.Retained("$aws/things/t1/shadow/update"); err != nil || m == nil || string(m.Payload) != "one" {
		t.Errorf("the state file's retained $aws message: %+v, %v", m, err)
	}
	shadow, _ := connectRaw(t, sb.tb.Addr, 5, "shadow", true, nil)
	shadow.subscribe(1, packets.Subscription{Filter: "$aws/things/+/shadow/update", Qos: 1})
	if got := shadow.untilPong(); len(got) != 1 || got[0].TopicName != "$aws/things/t1/shadow/update" || !got[0].FixedHeader.Retain {
		t.Errorf("a new $aws subscription got %v, want the retained $aws/things/t1/shadow/update", describeAll(got))
	}
	wild, _ := connectRaw(t, sb.tb.Addr, 5, "wild", true, nil)
	wild.subscribe(1, packets.Subscription{Filter: "#", Qos: 1})
	if got := wild.untilPong(); len(got) != 1 || got[0].TopicName != "plain/t1" {
		t.Errorf("a new # subscription got %v, want plain/t1 alone", describeAll(got))
	}
}

// describeAll describes packets for a message.
func describeAll(pks []*packets.Packet) []string {
	var out []string
	for _, pk := range pks {
		out = append(out, rawDescribe(pk))
	}
	return out
}

// topicRefuser is an Outbound that refuses topics holding a space, as a
// bridge to NATS does.
type topicRefuser struct{}

func (topicRefuser) Offer(m *Offered, _ *storage.Batch) error {
	for i := range len(m.Topic) {
		if m.Topic[i] == ' ' {
			return ErrTopicRefused
		}
	}
	return nil
}

// TestOutboundTopicRefused: a topic an Outbound refuses still reaches
// local subscribers; an MQTT 5 QoS 1/2 publisher is told with 0x90, and
// the refused QoS 2 flow ends at its PUBREC, so that the same packet
// identifier then carries a new message [MQTT-4.3.3-9]; a 3.1.1
// publisher, which has no code for it, is acknowledged; an in-process
// QoS 1 publisher gets ErrTopicRefused.
func TestOutboundTopicRefused(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, func(o *Options) { o.Outbound = []Outbound{topicRefuser{}} })
	sub, _ := connectRaw(t, tb.Addr, 5, "sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "site/#", Qos: 2})

	v5, _ := connectRaw(t, tb.Addr, 5, "v5", true, nil)
	v5.send(rawPublish("site/bad topic", "a", 1, false, 1))
	if ack := v5.expectAck(packets.Puback, 1, rcTopicNameInvalid); ack.Properties.ReasonString == "" {
		t.Error("PUBACK 0x90 without a reason string")
	}
	sub.ackPublish(sub.expectPublish("site/bad topic", "a", 1))
	v5.send(rawPublish("site/bad topic", "b", 2, false, 2))
	v5.expectAck(packets.Pubrec, 2, rcTopicNameInvalid)
	sub.ackPublish(sub.expectPublish("site/bad topic", "b", 2))
	v5.publish(rawPublish("site/good", "c", 2, false, 2)) // identifier 2 again: a new message
	sub.ackPublish(sub.expectPublish("site/good", "c", 2))

	v3, _ := connectRaw(t, tb.Addr, 4, "v3", true, nil)
	v3.publish(rawPublish("site/bad topic", "d", 1, false, 1))
	sub.ackPublish(sub.expectPublish("site/bad topic", "d", 1))

	cl, err := tb.Connect("in-process")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Publish(context.Background(), "site/bad topic", []byte("e"), 1, false); !errors.Is(err, ErrTopicRefused) {
		t.Errorf("in-process QoS 1: %v, want ErrTopicRefused", err)
	}
	sub.ackPublish(sub.expectPublish("site/bad topic", "e", 1))
	if err := cl.Publish(context.Background(), "site/bad topic", []byte("f"), 0, false); err != nil {
		t.Errorf("in-process QoS 0: %v, want nil: QoS 0 has no answer", err)
	}
	sub.expectPublish("site/bad topic", "f", 0)
	if st := tb.Stats(); st.Refused != 0 {
		t.Errorf("broker refused count %d: a refused topic is the Outbound's to count, not a full queue", st.Refused)
	}
}
