package broker

import (
	"bytes"
	"slices"
	"strconv"
	"testing"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
)

// MQTT 5.0 conformance of SUBSCRIBE and UNSUBSCRIBE options, shared
// subscriptions and retained messages.

func TestV5NoLocal(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	self, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "nl-self", CleanStart: true})
	self.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: "nl/quiet/#", QoS: 1, NoLocal: true},
		{Topic: "nl/echo/#", QoS: 1},
	}})
	other, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "nl-other", CleanStart: true})
	other.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "nl/#", QoS: 1, NoLocal: true}}})

	// Not forwarded to the connection of the same client id
	// [MQTT-3.8.3-3], forwarded to everyone else.
	self.publish(&paho.Publish{Topic: "nl/quiet/t", QoS: 1, Payload: []byte("own")})
	if m := other.next(); m.Topic != "nl/quiet/t" || string(m.Payload) != "own" {
		t.Errorf("other client got %q %q", m.Topic, m.Payload)
	}
	// Without No Local a client gets its own messages back.
	self.publish(&paho.Publish{Topic: "nl/echo/t", QoS: 1, Payload: []byte("echo")})
	if m := self.next(); m.Topic != "nl/echo/t" {
		t.Errorf("publisher got %q, want its echo on nl/echo/t", m.Topic)
	}
	other.next()
	self.expectNone(rawQuiet)
}

func TestV5RetainAsPublished(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	keep, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "rap-keep", CleanStart: true})
	keep.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rap/#", RetainAsPublished: true}}})
	clear, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "rap-clear", CleanStart: true})
	clear.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "rap/#"}}})
	pub, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "rap-pub", CleanStart: true})

	for _, retain := range []bool{true, false} {
		pub.publish(&paho.Publish{Topic: "rap/t", Retain: retain, Payload: []byte("x")})
		if m := keep.next(); m.Retain != retain {
			t.Errorf("retain as published: flag %t, want %t [MQTT-3.3.1-13]", m.Retain, retain)
		}
		if m := clear.next(); m.Retain {
			t.Errorf("without retain as published: flag set [MQTT-3.3.1-12]")
		}
	}
}

func TestV5RetainHandling(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	pub, _ := connectRaw(t, tb.Addr, 5, "rh-pub", true, nil)
	pub.publish(rawPublish("rh/t", "kept", 1, true, 1))

	for _, tc := range []struct {
		handling    byte
		first, then bool // retained message on the first subscribe, on the same one again
		spec        string
	}{
		{0, true, true, "[MQTT-3.3.1-9] [MQTT-3.8.4-4]"},
		{1, true, false, "[MQTT-3.3.1-10]"},
		{2, false, false, "[MQTT-3.3.1-11]"},
	} {
		c, _ := connectRaw(t, tb.Addr, 5, "rh-"+strconv.Itoa(int(tc.handling)), true, nil)
		for i, want := range []bool{tc.first, tc.then} {
			c.subscribe(uint16(i+1), packets.Subscription{Filter: "rh/#", Qos: 1, RetainHandling: tc.handling})
			got := c.untilPong()
			switch {
			case want && len(got) != 1:
				t.Errorf("retain handling %d, subscribe %d: %d packets, want the retained message %s", tc.handling, i+1, len(got), tc.spec)
			case !want && len(got) != 0:
				t.Errorf("retain handling %d, subscribe %d: got %s, want nothing %s", tc.handling, i+1, rawDescribe(got[0]), tc.spec)
			}
			for _, pk := range got {
				if pk.TopicName != "rh/t" || string(pk.Payload) != "kept" || !pk.FixedHeader.Retain {
					t.Errorf("got %s, want the retained message with RETAIN 1 (§3.3.1.3)", rawDescribe(pk))
				}
				c.ackPublish(pk)
			}
		}
	}
}

func TestV5SubscriptionIdentifiers(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "sid", true, nil)
	sub := func(pid uint16, filter string, qos byte, id int) {
		t.Helper()
		pk := rawSubscribe(pid, packets.Subscription{Filter: filter, Qos: qos})
		if id != 0 {
			pk.Properties.SubscriptionIdentifier = []int{id}
		}
		if codes := c.subscribePacket(pk); !bytes.Equal(codes, []byte{qos}) {
			t.Fatalf("SUBACK % X for %q", codes, filter)
		}
	}
	sub(1, "sid/+", 0, 1)
	sub(2, "sid/#", 2, 2)
	sub(3, "sid/x", 1, 0)
	p, _ := connectRaw(t, tb.Addr, 5, "sid-pub", true, nil)

	for _, tc := range []struct {
		topic string
		ids   []int
		qos   byte
	}{
		// Three overlapping subscriptions: one message, at the highest
		// QoS granted [MQTT-3.3.4-2], with every identifier
		// [MQTT-3.3.4-3] [MQTT-3.3.4-4].
		{"sid/x", []int{1, 2}, 2},
		{"sid/y", []int{1, 2}, 2},
		{"sid/y/z", []int{2}, 2},
	} {
		p.publish(rawPublish(tc.topic, "m", 2, false, 1))
		m := c.expectPublish(tc.topic, "m", tc.qos)
		got := slices.Sorted(slices.Values(m.Properties.SubscriptionIdentifier))
		if !slices.Equal(got, tc.ids) {
			t.Errorf("%s: subscription identifiers %v, want %v [MQTT-3.3.4-4]", tc.topic, got, tc.ids)
		}
		c.ackPublish(m)
	}
	c.quiet()

	// A retained message sent for a new subscription carries its
	// identifier [MQTT-3.3.4-3].
	p.publish(rawPublish("sidr/t", "r", 1, true, 2))
	r, _ := connectRaw(t, tb.Addr, 5, "sid-r", true, nil)
	pk := rawSubscribe(1, packets.Subscription{Filter: "sidr/t", Qos: 1})
	pk.Properties.SubscriptionIdentifier = []int{268_435_455} // the largest allowed (§3.8.2.1.2)
	r.subscribePacket(pk)
	m := r.expectPublish("sidr/t", "r", 1)
	if !slices.Equal(m.Properties.SubscriptionIdentifier, []int{268_435_455}) {
		t.Errorf("retained message subscription identifiers %v, want [268435455]", m.Properties.SubscriptionIdentifier)
	}
}

func TestV5SharedSubscription(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	p, _ := connectRaw(t, tb.Addr, 5, "sh-pub", true, nil)
	p.publish(rawPublish("sh/retained", "old", 1, true, 1))

	var members []*rawClient
	for i := range 2 {
		m, _ := connectRaw(t, tb.Addr, 5, "sh-member"+strconv.Itoa(i), true, nil)
		if codes := m.subscribe(1, packets.Subscription{Filter: "$share/g/sh/#", Qos: 1}); !bytes.Equal(codes, []byte{1}) {
			t.Fatalf("SUBACK % X for a shared subscription", codes)
		}
		members = append(members, m)
	}
	plain, _ := connectRaw(t, tb.Addr, 5, "sh-plain", true, nil)
	plain.subscribe(1, packets.Subscription{Filter: "sh/#", Qos: 1})
	// Retained messages go to new non-shared subscriptions only (§4.8.2,
	// §3.3.1.3).
	plain.ackPublish(plain.expectPublish("sh/retained", "old", 1))
	for _, m := range members {
		m.quiet()
	}

	const n = 10
	for i := range n {
		p.publish(rawPublish("sh/t", strconv.Itoa(i), 1, false, uint16(i+1)))
	}
	// Each message to exactly one member of the group (§4.8.2); the
	// non-shared subscription gets them all.
	seen := map[string]int{}
	per := make([]int, len(members))
	for len(seen) < n {
		progress := false
		for i, m := range members {
			pk, err := m.recv(rawQuiet)
			if err != nil {
				continue
			}
			if pk.FixedHeader.Type != packets.Publish || pk.TopicName != "sh/t" {
				t.Fatalf("member %d got %s", i, rawDescribe(pk))
			}
			m.ackPublish(pk)
			seen[string(pk.Payload)]++
			per[i]++
			progress = true
		}
		if !progress {
			t.Fatalf("the group received %d of %d messages", len(seen), n)
		}
	}
	for payload, count := range seen {
		if count != 1 {
			t.Errorf("message %s delivered %d times to the group", payload, count)
		}
	}
	for i, m := range members {
		m.quiet()
		if per[i] == 0 {
			t.Errorf("member %d received none of %d messages", i, n)
		}
	}
	for i := range n {
		plain.ackPublish(plain.expectPublish("sh/t", strconv.Itoa(i), 1))
	}
}

func TestV5SharedSubscriptionNoLocal(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := connectRaw(t, tb.Addr, 5, "sh-nl", true, nil)
	c.send(rawSubscribe(1, packets.Subscription{Filter: "$share/g/t", NoLocal: true}))
	c.expectDisconnect(rcProtocolError) // [MQTT-3.8.3-4]
}

func TestV5Unsubscribe(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	c, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "unsub", CleanStart: true})
	c.subscribe(&paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "u/a", QoS: 1}, {Topic: "u/b", QoS: 1}}})

	ctx := t.Context()
	ack, err := c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"u/a", "u/none", "u/+"}})
	if err != nil {
		t.Fatalf("unsubscribe: %v", err)
	}
	// One UNSUBACK, one reason code per filter, in order [MQTT-3.10.4-6]
	// [MQTT-3.11.3-1]: 0x11 where no subscription existed (§3.11.3).
	if want := []byte{0x00, 0x11, 0x11}; !bytes.Equal(ack.Reasons, want) {
		t.Errorf("UNSUBACK reasons % X, want % X", ack.Reasons, want)
	}
	pub, _ := v5Connect(t, tb.Addr, &paho.Connect{ClientID: "unsub-pub", CleanStart: true})
	pub.publish(&paho.Publish{Topic: "u/a", QoS: 1, Payload: []byte("gone")})
	pub.publish(&paho.Publish{Topic: "u/b", QoS: 1, Payload: []byte("kept")})
	// The deleted subscription gets nothing more [MQTT-3.10.4-2].
	if m := c.next(); m.Topic != "u/b" {
		t.Errorf("got %q after unsubscribing from it", m.Topic)
	}
	c.expectNone(rawQuiet)

	// The raw view: an UNSUBACK with the same packet identifier even
	// when nothing was deleted [MQTT-3.10.4-4] [MQTT-3.10.4-5].
	r, _ := connectRaw(t, tb.Addr, 5, "unsub-raw", true, nil)
	r.send(rawUnsubscribe(9, "nothing/here"))
	u := r.expect(packets.Unsuback)
	if u.PacketID != 9 || !bytes.Equal(u.ReasonCodes, []byte{0x11}) {
		t.Errorf("got %s, want UNSUBACK id 9 reasons 11", rawDescribe(u))
	}
}

func TestV5RetainedMessages(t *testing.T) {
	t.Parallel()
	tb := startBroker(t, nil)
	p, _ := connectRaw(t, tb.Addr, 5, "ret-pub", true, nil)
	live, _ := connectRaw(t, tb.Addr, 5, "ret-live", true, nil)
	live.subscribe(1, packets.Subscription{Filter: "ret/#", Qos: 1})
	var n int
	// fresh subscribes a new client to filter and returns what it gets
	// at once: the retained messages, if any.
	fresh := func(filter string) []*packets.Packet {
		t.Helper()
		n++
		c, _ := connectRaw(t, tb.Addr, 5, "ret-"+strconv.Itoa(n), true, nil)
		c.subscribe(1, packets.Subscription{Filter: filter, Qos: 1})
		got := c.untilPong()
		for _, pk := range got {
			if pk.FixedHeader.Type != packets.Publish {
				t.Fatalf("got %s", rawDescribe(pk))
			}
			c.ackPublish(pk)
		}
		return got
	}
	expectRetained := func(filter, topic, payload string) {
		t.Helper()
		got := fresh(filter)
		if len(got) != 1 || got[0].TopicName != topic || string(got[0].Payload) != payload {
			var s []string
			for _, pk := range got {
				s = append(s, rawDescribe(pk))
			}
			t.Fatalf("subscribing to %q got %v, want only %q %q", filter, s, topic, payload)
		}
		if !got[0].FixedHeader.Retain {
			t.Errorf("retained message sent on subscribe with RETAIN 0 (§3.3.1.3)")
		}
	}
	liveGot := func(payload string) {
		t.Helper()
		m := live.expectPublish("ret/t", payload, 1)
		if m.FixedHeader.Retain {
			t.Errorf("live delivery kept RETAIN without retain as published [MQTT-3.3.1-12]")
		}
		live.ackPublish(m)
	}

	p.publish(rawPublish("ret/t", "one", 1, true, 1))
	liveGot("one")
	expectRetained("ret/t", "ret/t", "one") // stored [MQTT-3.3.1-5]
	expectRetained("ret/#", "ret/t", "one")

	p.publish(rawPublish("ret/t", "two", 1, true, 2))
	liveGot("two")
	expectRetained("ret/+", "ret/t", "two") // replaced [MQTT-3.3.1-5]

	p.publish(rawPublish("ret/t", "three", 1, false, 3))
	liveGot("three")
	expectRetained("ret/t", "ret/t", "two") // not replaced by a non-retained one [MQTT-3.3.1-8]

	// An empty retained message is delivered as any other
	// [MQTT-3.3.1-6], clears the topic's retained message and is not
	// stored itself [MQTT-3.3.1-7].
	p.publish(rawPublish("ret/t", "", 1, true, 4))
	liveGot("")
	if got := fresh("ret/#"); len(got) != 0 {
		t.Errorf("subscribing after the delete got %s", rawDescribe(got[0]))
	}
}
