package reliability

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The access-control attacks: a user on the LAN with a valid login of
// their own tries to read what belongs to another. Each case runs against
// the real binary, with a password file written by `fieldgate passwd` and
// rules in its configuration file.

// hostileACLRules are the rules of the access-control cases before the
// reload: every user owns devices/{user}/#, everyone reads site/#, only
// alice writes it, and bob may not read site/secret/#.
const hostileACLRules = `    - {user: "*", topic: "devices/%u/#", access: readwrite}
    - {user: "*", topic: "site/#", access: read}
    - {user: alice, topic: "site/#", access: write}
    - {user: bob, topic: "site/secret/#", access: deny}
`

// hostileACLRevoked are the rules after the reload: site/# is alice's
// alone.
const hostileACLRevoked = `    - {user: "*", topic: "devices/%u/#", access: readwrite}
    - {user: alice, topic: "site/#", access: readwrite}
`

func hostileACLConfig(passwdPath, rules string) string {
	return plainYAML("  password_file: " + strconv.Quote(passwdPath) + "\n  acl:\n" + rules)
}

// TestHostileACL: bob, refused alice's topics, tries to take her session
// over by its client id (as himself and anonymously, with and without a
// clean start); subscribes to "#" to read what the rules keep from him;
// and keeps reading through subscriptions, live and stored, after a
// reload revoked his read rule. Each must fail, while alice's session and
// queue stay hers.
func TestHostileACL(t *testing.T) {
	rec := relrecord.Begin(t, "hostile", "access control: takeover, wildcard, revoked rule")
	bin := buildGateway(t, t.TempDir())
	pw := filepath.Join(t.TempDir(), "passwd")
	for _, u := range []string{"alice", "bob"} {
		passwd(t, bin, pw, u, u+"-pw")
	}
	g := newGatewayYAML(t, bin, hostileACLConfig(pw, hostileACLRules))
	g.start()
	t.Cleanup(g.stop)
	addr := g.addr
	must := func(c *client, _ bool, err error) *client {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// alice's phone keeps a session on her topics and goes away; her
	// desk publishes one message it queues.
	phone := must(dialAs(addr, "alice-phone", "alice", "alice-pw", true, sessionExpiry, 0))
	if err := phone.subscribe("devices/alice/#", 1); err != nil {
		t.Fatal(err)
	}
	phone.disconnect()
	desk := must(dialAs(addr, "alice-desk", "alice", "alice-pw", true, 0, 0))
	defer desk.close()
	publishAcked(t, desk, "devices/alice/door", "open", 1)

	bob := must(dialAs(addr, "bob-1", "bob", "bob-pw", true, 0, 0))
	defer bob.close()
	if code, _ := refusedCode(bob.subscribe("devices/alice/#", 1)); code != 0x87 {
		t.Fatalf("bob subscribing to devices/alice/#: code %#x, want 0x87", code)
	}

	// Takeover by client id.
	attempts := []struct {
		user, pw string
		clean    bool
	}{{"bob", "bob-pw", false}, {"bob", "bob-pw", true}, {"", "", false}, {"", "", true}}
	refused := 0
	for _, a := range attempts {
		c, present, err := dialAs(addr, "alice-phone", a.user, a.pw, a.clean, sessionExpiry, 0)
		if err == nil {
			got := readTopics(t, c)
			c.close()
			t.Errorf("user %q took alice's session over (clean %v, session present %v) and read %v", a.user, a.clean, present, got)
			continue
		}
		if code, ok := refusedCode(err); !ok || code != 0x87 {
			t.Fatalf("user %q taking alice's client id: %v, want CONNACK 0x87", a.user, err)
		}
		refused++
	}
	rec.Add("takeover attempts refused", "%d of %d (CONNACK 0x87)", refused, len(attempts))
	phone, present, err := dialAs(addr, "alice-phone", "alice", "alice-pw", false, sessionExpiry, 0)
	if err != nil || !present {
		t.Fatalf("alice resuming her session: present %v, %v", present, err)
	}
	if got := readTopics(t, phone); !slices.Equal(got, []string{"devices/alice/door"}) {
		t.Fatalf("alice's queue after the attempts: %v, want [devices/alice/door]", got)
	}
	rec.Add("owner's queue after the attempts", "intact")

	// "#" is granted (a deny rule reaches part of it) and checked per
	// message.
	wild := must(dialAs(addr, "bob-wild", "bob", "bob-pw", true, 0, 0))
	defer wild.close()
	if err := wild.subscribe("#", 1); err != nil {
		t.Fatalf("bob subscribing to #: %v", err)
	}
	open := must(dialAs(addr, "bob-open", "bob", "bob-pw", true, 0, 0))
	defer open.close()
	if err := open.subscribe("site/open/#", 1); err != nil {
		t.Fatal(err)
	}
	away := must(dialAs(addr, "bob-away", "bob", "bob-pw", true, sessionExpiry, 0))
	if err := away.subscribe("site/open/#", 1); err != nil {
		t.Fatal(err)
	}
	away.disconnect()
	for _, m := range []string{"site/secret/plan", "site/open/1", "devices/alice/door"} {
		publishAcked(t, desk, m, "x", 1)
	}
	if got := readTopics(t, wild); !slices.Equal(got, []string{"site/open/1"}) {
		t.Errorf("bob's # received %v, want only [site/open/1]", got)
	}
	if got := readTopics(t, open); !slices.Equal(got, []string{"site/open/1"}) {
		t.Errorf("bob's site/open/# received %v before the reload, want [site/open/1]", got)
	}
	if got := readTopics(t, phone); !slices.Equal(got, []string{"devices/alice/door"}) {
		t.Errorf("alice received %v, want [devices/alice/door]", got)
	}
	rec.Add("bob's # subscription", "granted; of site/secret/plan, site/open/1 and devices/alice/door it delivered only site/open/1")

	// Revoke bob's read rule and reload.
	cfg := hostileACLConfig(pw, hostileACLRevoked)
	cfg = strings.NewReplacer("%STATE%", strconv.Quote(g.dbPath), "%ADDR%", strconv.Quote(g.addr), "%OPS%", strconv.Quote(g.opsAddr)).Replace(cfg)
	if err := os.WriteFile(g.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g.reload()
	publishAcked(t, desk, "site/open/2", "after", 1)
	for name, c := range map[string]*client{"#": wild, "site/open/#": open} {
		if got := readTopics(t, c); len(got) > 0 {
			t.Errorf("bob's connected %s subscription delivered %v after the reload revoked his read rule", name, got)
		}
	}
	away, present, err = dialAs(addr, "bob-away", "bob", "bob-pw", false, sessionExpiry, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer away.close()
	publishAcked(t, desk, "site/open/3", "after", 1)
	if got := readTopics(t, away); len(got) > 0 {
		t.Errorf("bob's stored subscription delivered %v after the reload", got)
	}
	if !strings.Contains(g.log.lines(1<<20), "subscriptions_dropped") {
		t.Error("the reload did not log the subscriptions it dropped")
	}
	rec.Add("after a reload revoking bob's read rule", "connected and stored subscriptions delivered nothing (stored session present %v)", present)
}

// publishAcked publishes at QoS 1 and fails the test unless the broker
// acknowledges with reason code 0.
func publishAcked(t *testing.T, c *client, topic, payload string, pid uint16) {
	t.Helper()
	if err := c.publish(topic, payload, 1, pid, false); err != nil {
		t.Fatal(err)
	}
	for {
		pk, err := c.read(ioTimeout)
		if err != nil {
			t.Fatalf("%s: waiting for PUBACK of %s: %v", c.id, topic, err)
		}
		if pk.FixedHeader.Type == packets.Puback && pk.PacketID == pid {
			if pk.ReasonCode != 0 {
				t.Fatalf("%s: PUBACK of %s: code %#x", c.id, topic, pk.ReasonCode)
			}
			return
		}
		t.Fatalf("%s: %s while waiting for PUBACK of %s", c.id, packetName(pk), topic)
	}
}

// readTopics returns the topics of the messages delivered to c so far,
// acknowledging each: it sends PINGREQ and reads until PINGRESP, which the
// broker queues after whatever it had routed to c before.
func readTopics(t *testing.T, c *client) []string {
	t.Helper()
	if err := c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}); err != nil {
		t.Fatal(err)
	}
	var topics []string
	for {
		pk, err := c.read(ioTimeout)
		if err != nil {
			t.Fatalf("%s: waiting for PINGRESP: %v", c.id, err)
		}
		switch pk.FixedHeader.Type {
		case packets.Pingresp:
			return topics
		case packets.Publish:
			topics = append(topics, pk.TopicName)
			if pk.FixedHeader.Qos == 1 {
				if err := c.ack(packets.Puback, pk.PacketID); err != nil {
					t.Fatal(err)
				}
			}
		default:
			t.Fatalf("%s: unexpected %s", c.id, fmt.Sprint(packetName(pk)))
		}
	}
}
