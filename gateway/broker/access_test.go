package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"
)

// cheapPasswords writes a password file in which each user's password is
// user+"-pw", hashed at bcrypt's lowest cost: these tests are about what
// a login may do, and a real cost under the race detector on a loaded
// machine would spend their time in bcrypt.
func cheapPasswords(t *testing.T, users ...string) string {
	t.Helper()
	var b strings.Builder
	for _, u := range users {
		h, err := bcrypt.GenerateFromPassword([]byte(u+"-pw"), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%s\n", u, h)
	}
	path := filepath.Join(t.TempDir(), "passwd")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// login sets a CONNECT's user name and password, and a session expiry
// interval for MQTT 5 (0 for none).
func login(user, password string, expiry uint32) func(*packets.Packet) {
	return func(pk *packets.Packet) {
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(user)
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(password)
		if expiry > 0 && pk.ProtocolVersion == 5 {
			pk.Properties.SessionExpiryInterval = expiry
			pk.Properties.SessionExpiryIntervalFlag = true
		}
	}
}

// connectAs connects with a user name and password and fails the test
// unless the broker accepts.
func connectAs(t *testing.T, addr string, version byte, id string, clean bool, user string, expiry uint32) (*rawClient, *packets.Packet) {
	t.Helper()
	return connectRaw(t, addr, version, id, clean, func(pk *packets.Packet) {
		pk.ProtocolVersion = version
		login(user, user+"-pw", expiry)(pk)
	})
}

// refusedAs connects with a user name and password and returns the
// CONNACK's code, which must be a refusal.
func refusedAs(t *testing.T, addr string, version byte, id string, clean bool, user string) byte {
	t.Helper()
	c := dialRaw(t, addr, version)
	pk := c.connectPacket(id, clean)
	pk.ProtocolVersion = version
	login(user, user+"-pw", 3600)(pk)
	ack := c.connect(pk)
	if ack.ReasonCode == 0 {
		t.Fatalf("%s connecting as %q was accepted", user, id)
	}
	c.expectClosed()
	return ack.ReasonCode
}

// TestSessionBelongsToItsUser: bob may not read devices/alice/#; taking
// alice's client id over, with or without a clean start, while her
// session is away or connected, is refused, and her queue and
// subscriptions stay hers.
func TestSessionBelongsToItsUser(t *testing.T) {
	passwd := cheapPasswords(t, "alice", "bob")
	tb := startBroker(t, func(o *Options) {
		o.PasswordFile = passwd
		o.AllowAnonymous = false
		o.ACL = []auth.ACLRule{{User: "*", Topic: "devices/%u/#", Access: "readwrite"}}
	})
	alice, _ := connectAs(t, tb.Addr, 5, "alice-phone", true, "alice", 3600)
	if codes := alice.subscribe(1, packets.Subscription{Filter: "devices/alice/#", Qos: 1}); codes[0] != 1 {
		t.Fatalf("alice's subscription: %#x", codes[0])
	}
	bob, _ := connectAs(t, tb.Addr, 5, "bob-1", true, "bob", 0)
	if codes := bob.subscribe(1, packets.Subscription{Filter: "devices/alice/#", Qos: 1}); codes[0] != rcNotAuthorized {
		t.Fatalf("bob subscribing to alice's topics: %#x, want 0x87", codes[0])
	}

	// Connected: bob cannot take the id over, and alice stays.
	if code := refusedAs(t, tb.Addr, 5, "alice-phone", false, "bob"); code != rcNotAuthorized {
		t.Fatalf("takeover of a connected session: %#x, want 0x87", code)
	}
	alice.ping()

	alice.disconnect(0)
	v5WaitOffline(t, tb.Broker, "alice-phone")
	writer, _ := connectAs(t, tb.Addr, 5, "alice-desk", true, "alice", 0)
	writer.publish(rawPublish("devices/alice/door", "open", 1, false, 1))

	for _, c := range []struct {
		version byte
		clean   bool
		want    byte
	}{{5, false, rcNotAuthorized}, {5, true, rcNotAuthorized}, {4, false, 0x05}, {4, true, 0x05}} {
		if code := refusedAs(t, tb.Addr, c.version, "alice-phone", c.clean, "bob"); code != c.want {
			t.Errorf("MQTT %d takeover, clean %v: %#x, want %#x", c.version, c.clean, code, c.want)
		}
	}

	back, ack := connectAs(t, tb.Addr, 5, "alice-phone", false, "alice", 3600)
	if !ack.SessionPresent {
		t.Fatal("alice's session is gone after bob's attempts")
	}
	back.ackPublish(back.expectPublish("devices/alice/door", "open", 1))
	writer.publish(rawPublish("devices/alice/door", "shut", 1, false, 2))
	back.ackPublish(back.expectPublish("devices/alice/door", "shut", 1))
	bob.quiet()
}

// TestCheckedSubscription: one deny rule leaves "#" subscribable, and
// the deny holds per message, live and retained; a filter wholly inside
// the deny is refused.
func TestCheckedSubscription(t *testing.T) {
	passwd := cheapPasswords(t, "reader", "writer")
	tb := startBroker(t, func(o *Options) {
		o.PasswordFile = passwd
		o.AllowAnonymous = false
		o.ACL = []auth.ACLRule{
			{User: "*", Topic: "#", Access: "readwrite"},
			{User: "reader", Topic: "secrets/#", Access: "deny"},
		}
	})
	w, _ := connectAs(t, tb.Addr, 5, "w", true, "writer", 0)
	w.publish(rawPublish("secrets/key", "old", 1, true, 1))
	w.publish(rawPublish("plain/a", "retained", 1, true, 2))

	r, _ := connectAs(t, tb.Addr, 5, "r", true, "reader", 0)
	codes := r.subscribe(1,
		packets.Subscription{Filter: "#", Qos: 1},
		packets.Subscription{Filter: "secrets/+", Qos: 1},
		packets.Subscription{Filter: "plain/#", Qos: 1})
	if codes[0] != 1 || codes[1] != rcNotAuthorized || codes[2] != 1 {
		t.Fatalf("SUBACK codes %x, want [1 87 1]", codes)
	}
	// Retained: plain/a twice (two subscriptions match), never the secret.
	for range 2 {
		r.ackPublish(r.expectPublish("plain/a", "retained", 1))
	}
	w.publish(rawPublish("secrets/key", "new", 1, false, 3))
	w.publish(rawPublish("plain/b", "live", 1, false, 4))
	// MQTT 5 sends one copy per matching subscription unless the broker
	// merges them; ours merges overlapping subscriptions of a session.
	r.ackPublish(r.expectPublish("plain/b", "live", 1))
	r.quiet()
	if n := tb.Stats().Withheld; n < 2 {
		t.Errorf("withheld deliveries counted %d, want at least 2 (a retained and a live secret)", n)
	}
}

// TestACLReload: new rules apply at once to every session: a connected
// client's subscription that the rules no longer allow stops delivering,
// an away session's is dropped with what it had queued, a subscription
// now reaching past the rules is checked per message, and a connected
// client publishes under the new rules.
func TestACLReload(t *testing.T) {
	passwd := cheapPasswords(t, "alice", "bob", "carol")
	tb := startBroker(t, func(o *Options) {
		o.PasswordFile = passwd
		o.AllowAnonymous = false
		o.ACL = []auth.ACLRule{{User: "*", Topic: "site/#", Access: "readwrite"}}
	})
	alice, _ := connectAs(t, tb.Addr, 5, "alice", true, "alice", 0)
	alice.subscribe(1, packets.Subscription{Filter: "site/a/#", Qos: 1})
	bob, _ := connectAs(t, tb.Addr, 5, "bob", true, "bob", 3600)
	bob.subscribe(1, packets.Subscription{Filter: "site/b/#", Qos: 1})
	bob.disconnect(0)
	v5WaitOffline(t, tb.Broker, "bob")
	carol, _ := connectAs(t, tb.Addr, 5, "carol", true, "carol", 0)
	carol.publish(rawPublish("site/b/queued", "for bob", 1, false, 1))
	carol.publish(rawPublish("site/a/x", "before", 1, false, 2))
	alice.ackPublish(alice.expectPublish("site/a/x", "before", 1))

	if err := tb.SetACL([]auth.ACLRule{
		{User: "*", Topic: "site/a/ok/#", Access: "read"},
		{User: "carol", Topic: "site/#", Access: "write"},
	}); err != nil {
		t.Fatal(err)
	}
	carol.publish(rawPublish("site/a/x", "after", 1, false, 3))
	carol.publish(rawPublish("site/a/ok/1", "allowed", 1, false, 4))
	alice.ackPublish(alice.expectPublish("site/a/ok/1", "allowed", 1))
	alice.quiet()

	// alice may no longer publish: PUBACK 0x87.
	alice.send(rawPublish("site/a/ok/2", "not any more", 1, false, 9))
	alice.expectAck(packets.Puback, 9, rcNotAuthorized)

	back, ack := connectAs(t, tb.Addr, 5, "bob", false, "bob", 3600)
	if !ack.SessionPresent {
		t.Fatal("bob's session should live on without the dropped subscription")
	}
	carol.publish(rawPublish("site/b/later", "not for bob", 1, false, 5))
	back.quiet()
	tb.mu.Lock()
	s := tb.sessions["bob"]
	tb.mu.Unlock()
	s.mu.Lock()
	subs, pending, inflight := len(s.subs), len(s.pending), len(s.inflight)
	s.mu.Unlock()
	if subs != 0 || pending != 0 || inflight != 0 {
		t.Errorf("bob's session holds %d subscriptions, %d pending and %d in flight after the reload, want none", subs, pending, inflight)
	}
}

// TestACLAtRestore: a persistent session restored under rules that no
// longer allow its subscription loses it, on disk too, and the messages
// it had queued.
func TestACLAtRestore(t *testing.T) {
	rules := []auth.ACLRule{{User: "*", Topic: "site/#", Access: "readwrite"}}
	sb := newStoredBroker(t, func(o *Options) { o.ACL = rules })
	sub, _ := connectRaw(t, sb.addr, 5, "away", true, v5Expiry(3600))
	sub.subscribe(1, packets.Subscription{Filter: "site/b/#", Qos: 1}, packets.Subscription{Filter: "site/a/#", Qos: 1})
	sub.disconnect(0)
	v5WaitOffline(t, sb.tb.Broker, "away")
	pub, _ := connectRaw(t, sb.addr, 5, "pub", true, nil)
	for i := range 3 {
		pub.publish(rawPublish(fmt.Sprintf("site/%c/x", 'a'+i%2), fmt.Sprint(i), 1, false, uint16(i+1)))
	}
	pub.close()

	rules = []auth.ACLRule{{User: "*", Topic: "site/a/#", Access: "readwrite"}}
	sb.restart()
	sb.restart() // what the first restart took must be gone from the file too
	c, ack := connectRaw(t, sb.addr, 5, "away", false, v5Expiry(3600))
	if !ack.SessionPresent {
		t.Fatal("session not present")
	}
	c.ackPublish(c.expectPublish("site/a/x", "0", 1))
	c.ackPublish(c.expectPublish("site/a/x", "2", 1))
	c.quiet()
	sb.tb.mu.Lock()
	s := sb.tb.sessions["away"]
	sb.tb.mu.Unlock()
	s.mu.Lock()
	_, kept := s.subs["site/a/#"]
	_, gone := s.subs["site/b/#"]
	s.mu.Unlock()
	if !kept || gone {
		t.Errorf("subscriptions after restore: site/a/# kept %v, site/b/# kept %v", kept, gone)
	}
}
