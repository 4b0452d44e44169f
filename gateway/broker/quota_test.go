package broker

import (
	"strings"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
)

// asUser makes a CONNECT edit that logs in as user (anonymous brokers
// take any name) with a session expiry of expiry seconds, 0 for none.
func asUser(user string, expiry uint32) func(*packets.Packet) {
	return func(pk *packets.Packet) {
		if user != "" {
			pk.Connect.UsernameFlag = true
			pk.Connect.Username = []byte(user)
		}
		if expiry > 0 {
			pk.Properties.SessionExpiryInterval = expiry
			pk.Properties.SessionExpiryIntervalFlag = true
		}
	}
}

// TestPersistentSessionBounds: past the bounds on persistent sessions, in
// all and per user, a new one is refused with 0x97 (MQTT 5) or 0x03
// (3.1.1); resuming one, and sessions without expiry, are not; ending one
// makes room.
func TestPersistentSessionBounds(t *testing.T) {
	tb := startBroker(t, func(o *Options) {
		o.MaxPersistentSessions = 3
		o.MaxPersistentSessionsPerUser = 2
	})
	a1, _ := connectRaw(t, tb.Addr, 5, "a1", true, asUser("alice", 60))
	a1.close()
	a2, _ := connectRaw(t, tb.Addr, 5, "a2", true, asUser("alice", 60))
	a2.close()

	c := dialRaw(t, tb.Addr, 5)
	pk := c.connectPacket("a3", true)
	asUser("alice", 60)(pk)
	if ack := c.connect(pk); ack.ReasonCode != rcQuotaExceeded {
		t.Errorf("alice's third persistent session: %s, want 0x97", rawDescribe(ack))
	}
	c.close()
	// Resumed, not new; and a session without expiry is not counted.
	r, ack := connectRaw(t, tb.Addr, 5, "a1", false, asUser("alice", 60))
	if !ack.SessionPresent {
		t.Error("a1 not resumed")
	}
	r.close()
	tmp, _ := connectRaw(t, tb.Addr, 5, "a-clean", true, asUser("alice", 0))
	tmp.close()

	b1, _ := connectRaw(t, tb.Addr, 5, "b1", true, asUser("bob", 60))
	b1.close()
	c = dialRaw(t, tb.Addr, 4)
	pk = c.connectPacket("b2", false) // 3.1.1 clean session off: persistent
	asUser("bob", 0)(pk)
	if ack := c.connect(pk); ack.ReasonCode != 0x03 {
		t.Errorf("3.1.1 past the total: %s, want 0x03", rawDescribe(ack))
	}
	c.close()

	// Ending a1 (clean start, no expiry) makes room for bob.
	e, _ := connectRaw(t, tb.Addr, 5, "a1", true, asUser("alice", 0))
	e.disconnect(0)
	b2, _ := connectRaw(t, tb.Addr, 4, "b2", false, asUser("bob", 0))
	b2.close()

	st := tb.Stats()
	if st.PersistentSessions != 3 || st.Refusals[refusedSessions] != 1 || st.Refusals[refusedSessionsPerUser] != 1 {
		t.Errorf("stats: %d persistent, refusals %v", st.PersistentSessions, st.Refusals)
	}
}

// TestFilterBounds: a filter longer than broker.max_filter_bytes gets
// 0x8F, one past a session's broker.max_session_filter_bytes 0x97 (0x80
// in 3.1.1); subscribing to a filter again adds nothing.
func TestFilterBounds(t *testing.T) {
	tb := startBroker(t, func(o *Options) {
		o.MaxFilterBytes = 16
		o.MaxSessionFilterBytes = 40
	})
	c, _ := connectRaw(t, tb.Addr, 5, "f5", true, nil)
	codes := c.subscribe(1,
		packets.Subscription{Filter: strings.Repeat("a", 17)},
		packets.Subscription{Filter: "0123456789abcdef", Qos: 1}, // 16
		packets.Subscription{Filter: "0123456789abcdeX", Qos: 1}, // 32
		packets.Subscription{Filter: "0123456789", Qos: 1},       // 42
		packets.Subscription{Filter: "0123456789abcdef", Qos: 0}, // held already
		packets.Subscription{Filter: "01234567", Qos: 1},         // 40
	)
	if want := []byte{rcFilterInvalid, 1, 1, rcQuotaExceeded, 0, 1}; string(codes) != string(want) {
		t.Errorf("MQTT 5 SUBACK % x, want % x", codes, want)
	}
	c3, _ := connectRaw(t, tb.Addr, 4, "f3", true, nil)
	codes = c3.subscribe(1, packets.Subscription{Filter: strings.Repeat("b", 17)}, packets.Subscription{Filter: "x"})
	if want := []byte{0x80, 0}; string(codes) != string(want) {
		t.Errorf("3.1.1 SUBACK % x, want % x", codes, want)
	}
	if r := tb.Stats().Refusals; r[refusedFilterBytes] != 2 || r[refusedSessionFilters] != 1 {
		t.Errorf("refusals %v", r)
	}
}

// TestRetainedBounds: past the retained bounds a retained publish is
// refused for the store (PUBACK 0x97 in MQTT 5) and still delivered live;
// replacing with no more bytes and deleting always work; the counts, and
// who set what, survive a restart, and a bound lowered below what is
// stored keeps it all and refuses only growth.
func TestRetainedBounds(t *testing.T) {
	limits := func(count, bytes, userCount, userBytes int) func(*Options) {
		return func(o *Options) {
			o.MaxRetained, o.MaxRetainedBytes = count, bytes
			o.MaxRetainedPerUser, o.MaxRetainedBytesPerUser = userCount, userBytes
		}
	}
	// Each message below costs 64 bytes plus topic and payload: 68 for
	// t/1 with "x".
	sb := newStoredBroker(t, limits(4, 1000, 2, 1000))
	sub, _ := connectRaw(t, sb.tb.Addr, 5, "sub", true, nil)
	sub.subscribe(1, packets.Subscription{Filter: "t/#", Qos: 1})
	alice, _ := connectRaw(t, sb.tb.Addr, 5, "alice", true, asUser("alice", 0))
	bob, _ := connectRaw(t, sb.tb.Addr, 5, "bob", true, asUser("bob", 0))

	pub := func(c *rawClient, topic, payload string, pid uint16, code byte) {
		t.Helper()
		c.send(rawPublish(topic, payload, 1, true, pid))
		c.expectAck(packets.Puback, pid, code)
		sub.ackPublish(sub.expectPublish(topic, payload, 1)) // a delete too

	}
	pub(alice, "t/1", "x", 1, 0)
	pub(alice, "t/2", "x", 2, 0)
	pub(alice, "t/3", "x", 3, rcQuotaExceeded) // alice's count
	pub(alice, "t/1", "y", 4, 0)               // replaced, same size
	pub(bob, "t/3", "x", 1, 0)
	pub(bob, "t/4", "x", 2, 0)
	pub(bob, "t/5", "x", 3, rcQuotaExceeded)                      // all messages
	pub(bob, "t/4", strings.Repeat("z", 800), 4, rcQuotaExceeded) // all bytes
	pub(bob, "t/4", "", 5, 0)                                     // deleted
	pub(bob, "t/5", "x", 6, 0)

	st := sb.tb.Stats()
	if st.RetainedCounted != 4 || st.RetainedBytes != 4*68 || st.Refusals[refusedRetained] != 2 || st.Refusals[refusedRetainedPerUser] != 1 {
		t.Errorf("stats: %d retained, %d bytes, refusals %v", st.RetainedCounted, st.RetainedBytes, st.Refusals)
	}
	// The gateway's own clients are counted, never refused.
	own, err := sb.tb.Connect("gateway-own")
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Publish(t.Context(), "t/own", []byte("x"), 1, true); err != nil {
		t.Errorf("the gateway's own retained publish: %v", err)
	}
	sub.ackPublish(sub.expectPublish("t/own", "x", 1))
	own.Close()
	for _, c := range []*rawClient{sub, alice, bob} {
		c.close()
	}

	// Restarted with lower bounds: everything is kept, owners included,
	// and only growth is refused.
	sb.edit = limits(2, 1000, 1, 1000)
	sb.restart()
	st = sb.tb.Stats()
	if st.RetainedCounted != 5 || st.RetainedBytes != 4*68+70 {
		t.Errorf("after restart: %d retained, %d bytes", st.RetainedCounted, st.RetainedBytes)
	}
	check, _ := connectRaw(t, sb.tb.Addr, 5, "check", true, nil)
	got := map[string]bool{}
	check.subscribe(1, packets.Subscription{Filter: "t/#"})
	for range 5 {
		got[check.expect(packets.Publish).TopicName] = true
	}
	if len(got) != 5 {
		t.Errorf("retained after restart: %v", got)
	}
	alice, _ = connectRaw(t, sb.tb.Addr, 5, "alice", true, asUser("alice", 0))
	alice.send(rawPublish("t/1", "w", 1, true, 1)) // replaced: no growth
	alice.expectAck(packets.Puback, 1, 0)
	alice.send(rawPublish("t/9", "w", 1, true, 2))
	alice.expectAck(packets.Puback, 2, rcQuotaExceeded)
	alice.send(rawPublish("t/2", "", 1, true, 3)) // deleted
	alice.expectAck(packets.Puback, 3, 0)
	// A QoS 0 retained publish past a bound is delivered, not stored,
	// as the refused QoS 1 one was.
	alice.send(rawPublish("t/8", "q", 0, true, 0))
	check.expectPublish("t/1", "w", 0)
	check.expectPublish("t/9", "w", 0)
	check.expectPublish("t/2", "", 0)
	check.expectPublish("t/8", "q", 0)
	alice.ping()
	if st := sb.tb.Stats(); st.RetainedCounted != 4 || st.Refusals[refusedRetained] != 2 {
		t.Errorf("after growth refused: %d retained, refusals %v", st.RetainedCounted, st.Refusals)
	}
}
