package broker

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"golang.org/x/crypto/bcrypt"
)

// TestCheckPassword checks the password check the broker lends the ops
// endpoint: it answers from the broker's password file, and refuses
// everyone without one.
func TestCheckPassword(t *testing.T) {
	passwd := writePasswordFile(t, "alice", "s3cret")
	locked := startBroker(t, func(o *Options) { o.PasswordFile = passwd })
	for _, c := range []struct {
		user, password string
		want           bool
	}{
		{"alice", "s3cret", true},
		{"alice", "s3cret", true}, // remembered
		{"alice", "wrong", false},
		{"bob", "s3cret", false},
		{"alice", "", false},
	} {
		if got := locked.CheckPassword(c.user, []byte(c.password)); got != c.want {
			t.Errorf("CheckPassword(%q, %q) = %v, want %v", c.user, c.password, got, c.want)
		}
	}
	open := startBroker(t, nil)
	if open.CheckPassword("alice", []byte("s3cret")) {
		t.Error("a broker without a password file accepted a password")
	}
}

// TestReloadPasswords checks a reload of the password file: a removed user
// and an old password are refused from then on, a new password accepted,
// the connected clients of the removed user and of the changed password
// disconnected (0x87 in MQTT 5, closed in 3.1.1) and every other client
// left alone. A file that fails to parse changes nothing.
func TestReloadPasswords(t *testing.T) {
	// bcrypt at its least cost: the test checks who gets in, not bcrypt,
	// and at cost 10 under the race detector it takes minutes.
	entry := func(user, password string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return user + ":" + string(h) + "\n"
	}
	passwd := filepath.Join(t.TempDir(), "passwd")
	write := func(entries ...string) {
		t.Helper()
		if err := os.WriteFile(passwd, []byte(strings.Join(entries, "")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	aliceEntry := entry("alice", "a1")
	write(aliceEntry, entry("bob", "b1"), entry("carol", "c1"))
	b := startBroker(t, func(o *Options) { o.PasswordFile = passwd })
	login := func(version byte, id, user, password string) *rawClient {
		c := dialRaw(t, b.Addr, version)
		pk := c.connectPacket(id, true)
		pk.Connect.UsernameFlag, pk.Connect.Username = true, []byte(user)
		pk.Connect.PasswordFlag, pk.Connect.Password = true, []byte(password)
		ack := c.connect(pk)
		if ack.ReasonCode != 0 {
			c.close()
			return nil
		}
		return c
	}
	alice := login(5, "alice-1", "alice", "a1")
	bob := login(5, "bob-1", "bob", "b1")
	carol := login(4, "carol-1", "carol", "c1")
	anon, _ := connectRaw(t, b.Addr, 5, "anon-1", true, nil)
	if alice == nil || bob == nil || carol == nil {
		t.Fatal("a login was refused before the reload")
	}

	// bob's password changes, carol goes, dave comes; alice's line stays.
	write(aliceEntry, entry("bob", "b2"), entry("dave", "d1"))
	r, err := b.ReloadPasswords()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(r.Added, r.Removed, r.Changed, r.Disconnected); got != "[dave] [carol] [bob] 2" {
		t.Errorf("reload: added, removed, changed, disconnected = %s, want [dave] [carol] [bob] 2", got)
	}
	bob.expectDisconnect(rcNotAuthorized)
	carol.expectClosed()
	alice.ping()
	anon.ping()

	for _, c := range []struct {
		user, password string
		want           bool
	}{
		{"alice", "a1", true},
		{"bob", "b1", false},
		{"bob", "b2", true},
		{"carol", "c1", false},
		{"dave", "d1", true},
	} {
		cl := login(5, "after-"+c.user, c.user, c.password)
		if got := cl != nil; got != c.want {
			t.Errorf("MQTT login %s/%s after the reload: accepted %v, want %v", c.user, c.password, got, c.want)
		}
		if cl != nil {
			cl.close()
		}
		if got := b.CheckPassword(c.user, []byte(c.password)); got != c.want {
			t.Errorf("CheckPassword(%s, %s) after the reload = %v, want %v", c.user, c.password, got, c.want)
		}
	}

	// A file that no longer parses keeps the users loaded before.
	write("alice:oops\n")
	if _, err := b.ReloadPasswords(); err == nil {
		t.Error("a password file with a bad line was reloaded")
	}
	alice.ping()
	if !b.CheckPassword("bob", []byte("b2")) {
		t.Error("a failed reload changed the running passwords")
	}

	open := startBroker(t, nil)
	if r, err := open.ReloadPasswords(); err != nil || !r.Empty() {
		t.Errorf("reload without a password file: %+v, %v", r, err)
	}
}

// TestCanPublish checks the permission the ops endpoint asks for before it
// switches an output: the broker's current ACL, a reload included.
func TestCanPublish(t *testing.T) {
	b := startBroker(t, func(o *Options) {
		o.ACL = []auth.ACLRule{
			{User: "alice", Topic: "fieldgate/+/+/set", Access: "write"},
			{User: "bob", Topic: "fieldgate/#", Access: "read"},
			{User: "bob", Topic: "devices/%c/#", Access: "write"},
		}
	})
	for _, c := range []struct {
		user, topic string
		want        bool
	}{
		{"alice", "fieldgate/gw/pump/set", true},
		{"bob", "fieldgate/gw/pump/set", false},
		{"", "fieldgate/gw/pump/set", false},
		{"bob", "devices/x/cmd", false}, // %c names no client here
		{"alice", "$SYS/x/set", false},
	} {
		if got := b.CanPublish(c.user, c.topic); got != c.want {
			t.Errorf("CanPublish(%q, %q) = %v, want %v", c.user, c.topic, got, c.want)
		}
	}
	b.SetACL([]auth.ACLRule{{User: "bob", Topic: "fieldgate/#", Access: "readwrite"}})
	if !b.CanPublish("bob", "fieldgate/gw/pump/set") || b.CanPublish("alice", "fieldgate/gw/pump/set") {
		t.Error("CanPublish does not follow SetACL")
	}
}
