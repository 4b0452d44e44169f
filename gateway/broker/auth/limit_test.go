package auth

import (
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// loadLimited loads content through an Authenticator with limits l.
func loadLimited(t *testing.T, l LoginLimits, content string) *Passwords {
	t.Helper()
	p, err := NewLimitedAuthenticator(l).LoadPasswords(writeFile(t, content))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkFromAsync runs CheckFrom in a goroutine and returns its result.
func checkFromAsync(p *Passwords, from netip.Addr, user, password string) <-chan Outcome {
	c := make(chan Outcome, 1)
	go func() { c <- p.CheckFrom(from, user, []byte(password)) }()
	return c
}

// waiting is the number of checks waiting for a bcrypt slot.
func (q *slotQueue) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.line)
}

func TestFailuresLimitAnAddress(t *testing.T) {
	l := DefaultLoginLimits()
	l.Failures = 3
	p := loadLimited(t, l, "bob:"+hash(t, "right")+"\n")
	bad, other := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	if o := p.CheckFrom(bad, "bob", []byte("right")); o != Accepted {
		t.Fatalf("right password = %s", o)
	}
	for i := range l.Failures {
		if o := p.CheckFrom(bad, "bob", []byte("wrong")); o != WrongPassword {
			t.Fatalf("wrong password %d = %s, want it checked", i+1, o)
		}
	}
	// Limited: refused without a check, even the right and remembered
	// password, which would otherwise be a guess answered for free.
	release := holdSlots(p.auth)
	for _, pw := range []string{"wrong", "right"} {
		select {
		case o := <-checkFromAsync(p, bad, "bob", pw):
			if o != Limited {
				t.Errorf("password %q from a limited address = %s, want limited", pw, o)
			}
		case <-time.After(testkit.Scale(10 * time.Second)):
			t.Fatalf("a limited address waited for a bcrypt slot")
		}
	}
	release()
	// Another address, and the zero Addr (a unix socket), are not limited.
	if o := p.CheckFrom(other, "bob", []byte("right")); o != Accepted {
		t.Errorf("right password from another address = %s", o)
	}
	if !p.Check("bob", []byte("right")) {
		t.Error("right password without an address refused")
	}
	// One failure is forgiven per interval.
	p.auth.sources.epoch = p.auth.sources.epoch.Add(-l.FailureInterval)
	if o := p.CheckFrom(bad, "bob", []byte("right")); o != Accepted {
		t.Errorf("right password an interval later = %s", o)
	}
	if o := p.CheckFrom(bad, "bob", []byte("wrong")); o != WrongPassword {
		t.Errorf("wrong password an interval later = %s, want one more check", o)
	}
	if o := p.CheckFrom(bad, "bob", []byte("wrong")); o != Limited {
		t.Errorf("wrong password after the forgiven one = %s, want limited", o)
	}
	got := p.auth.Refused()
	if got["password"] != int64(l.Failures+1) || got["limited"] != 3 || got["queue_full"] != 0 || got["queue_timeout"] != 0 {
		t.Errorf("Refused() = %v", got)
	}
}

func TestSuccessDoesNotWipeFailures(t *testing.T) {
	l := DefaultLoginLimits()
	l.Failures = 2
	p := loadLimited(t, l, "bob:"+hash(t, "right")+"\nmallory:"+hash(t, "mine")+"\n")
	from := netip.MustParseAddr("2001:db8::1")
	for range 2 {
		p.CheckFrom(from, "bob", []byte("guess"))
		// A client's own account must not pay off its guesses.
		p.CheckFrom(from, "mallory", []byte("mine"))
	}
	if o := p.CheckFrom(from, "bob", []byte("guess")); o != Limited {
		t.Errorf("third guess = %s, want limited", o)
	}
}

func TestSourceTableBounded(t *testing.T) {
	l := DefaultLoginLimits()
	l.Sources, l.Failures = 3, 1
	tb := newSourceTable(l)
	addr := func(i byte) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, i}) }
	for i := range byte(3) {
		if misses, ok := tb.take(addr(i)); !near(misses, 0) || !ok {
			t.Fatalf("a new address: misses %v ok %v", misses, ok)
		}
	}
	if misses, ok := tb.take(addr(0)); ok || !near(misses, 1) {
		t.Fatalf("an address past its failures: misses %v ok %v, want 1 and limited", misses, ok)
	}
	// A fourth address forgets the one touched longest ago (1), not 0,
	// and starts with its misses.
	misses, ok := tb.take(addr(3))
	if !ok || !near(misses, 1) || tb.len() != 3 {
		t.Errorf("fourth address in a full table: misses %v ok %v, %d entries; want 1, ok, 3", misses, ok, tb.len())
	}
	if _, ok := tb.take(addr(0)); ok {
		t.Error("the most recently touched address was forgotten")
	}
	if _, ok := tb.take(addr(1)); !ok {
		t.Error("the oldest address was not the one forgotten")
	}
	// A login turned away without a check is a miss, not a failure; a
	// success pays back both.
	tb.epoch = tb.epoch.Add(-10 * l.FailureInterval)
	tb.take(addr(8))
	tb.turnedAway(addr(8))
	if misses, ok := tb.take(addr(8)); !near(misses, 1) || !ok {
		t.Errorf("an address turned away once: misses %v ok %v, want 1, ok", misses, ok)
	}
	tb.refund(addr(8))
	if misses, ok := tb.take(addr(8)); !near(misses, 1) || !ok {
		t.Errorf("after a success: misses %v ok %v, want 1, ok", misses, ok)
	}
	// Misses and debts fall by one per interval.
	tb.epoch = tb.epoch.Add(-2 * l.FailureInterval)
	if misses, ok := tb.take(addr(8)); !near(misses, 0) || !ok {
		t.Errorf("two intervals later: misses %v ok %v, want 0, ok", misses, ok)
	}
}

// near reports whether a decaying count is n, give or take the time a
// test takes.
func near(x float64, n int) bool { return x > float64(n)-0.01 && x < float64(n)+0.01 }

func TestQueueBounds(t *testing.T) {
	l := DefaultLoginLimits()
	l.Queue, l.QueueWait = 2, testkit.Scale(300*time.Millisecond)
	p := loadLimited(t, l, "bob:"+hash(t, "right")+"\n")
	q := p.auth.slots
	debtor := netip.MustParseAddr("192.0.2.9")
	if o := p.CheckFrom(debtor, "bob", []byte("wrong")); o != WrongPassword {
		t.Fatalf("wrong password = %s", o)
	}
	release := holdSlots(p.auth)
	// Two checks from an address that owes a failure fill the queue.
	w1 := checkFromAsync(p, debtor, "bob", "wrong")
	testkit.WaitFor(t, 10*time.Second, "a check waiting", func() bool { return q.waiting() == 1 })
	w2 := checkFromAsync(p, debtor, "bob", "wrong")
	testkit.WaitFor(t, 10*time.Second, "two checks waiting", func() bool { return q.waiting() == 2 })
	// A third from it is refused at once.
	if o := p.CheckFrom(debtor, "bob", []byte("right")); o != QueueFull {
		t.Errorf("a check past the queue = %s, want queue_full", o)
	}
	// An address with fewer misses takes the place of the waiter with
	// the most, the newest among equals, and is served first.
	clean := checkFromAsync(p, netip.MustParseAddr("192.0.2.10"), "bob", "right")
	if o := <-w2; o != QueueFull {
		t.Errorf("the displaced check = %s, want queue_full", o)
	}
	release()
	if o := <-clean; o != Accepted {
		t.Errorf("the clean check = %s, want accepted", o)
	}
	if o := <-w1; o != WrongPassword {
		t.Errorf("the first waiting check = %s, want it checked", o)
	}
	// A check that waits QueueWait is refused.
	release = holdSlots(p.auth)
	t0 := time.Now()
	if o := p.CheckFrom(netip.MustParseAddr("192.0.2.11"), "bob", []byte("wrong")); o != QueueTimeout {
		t.Errorf("a check that waited = %s, want queue_timeout", o)
	}
	if d := time.Since(t0); d < l.QueueWait {
		t.Errorf("refused after %s, before queue_wait %s", d, l.QueueWait)
	}
	release()
	if q.waiting() != 0 {
		t.Errorf("%d checks left waiting", q.waiting())
	}
	// No guess was tested on the refused checks: the address owes for
	// the checked ones only, so it is not limited.
	if o := p.CheckFrom(debtor, "bob", []byte("right")); o != Accepted {
		t.Errorf("right password from the address afterwards = %s", o)
	}
}

func TestSource(t *testing.T) {
	for _, c := range []struct {
		in   any
		want string
	}{
		{"192.0.2.1:1883", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:1883", "192.0.2.1"},
		{"[fe80::1%eth0]:80", "fe80::1"},
		{"192.0.2.7", "192.0.2.7"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::2"), Port: 5}, "2001:db8::2"},
		{&net.UnixAddr{Name: "/run/fieldgate/mqtt.sock", Net: "unix"}, "invalid IP"},
		{"@", "invalid IP"},
	} {
		if got := Source(c.in).String(); got != c.want {
			t.Errorf("Source(%v) = %s, want %s", c.in, got, c.want)
		}
	}
}

func TestLoginLimitsCheck(t *testing.T) {
	k := check.New(nil, false)
	DefaultLoginLimits().Check(k, "broker.login")
	if len(k.Problems()) != 0 {
		t.Fatalf("defaults: %v", k.Problems())
	}
	k = check.New(nil, false)
	LoginLimits{Queue: -1, QueueWait: 0, Failures: 0, FailureInterval: time.Millisecond, Sources: 0}.Check(k, "broker.login")
	var got []string
	for _, p := range k.Problems() {
		got = append(got, p.Path)
	}
	want := "broker.login.queue broker.login.queue_wait broker.login.failures broker.login.failure_interval broker.login.sources"
	if strings.Join(got, " ") != want {
		t.Errorf("problems at %v, want %s", got, want)
	}
}

// TestSourceBytes measures what a remembered address costs, which
// sourceBytes states.
func TestSourceBytes(t *testing.T) {
	const n = 1 << 14
	l := DefaultLoginLimits()
	l.Sources = n
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := newSourceTable(l)
	for i := range n {
		tb.take(netip.AddrFrom16([16]byte{0x20, 0x01, 0xd, 0xb8, 14: byte(i >> 8), 15: byte(i)}))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes an address", per)
	if per > sourceBytes {
		t.Errorf("%.0f bytes an address, more than sourceBytes (%d)", per, sourceBytes)
	}
	runtime.KeepAlive(tb)
}
