package auth

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"golang.org/x/crypto/bcrypt"
)

// What a flood of wrong passwords may cost. A bcrypt check is a fraction
// of a second of a core (HashCost), so a server that checks every attempt
// in turn lets strangers queue up minutes of work in front of a device
// that has a right password. Three bounds keep that work, and the wait, in
// hand:
//
//   - an address that failed too often lately is refused without a check
//     (a debt of failures per source address, paid back one per
//     FailureInterval);
//   - at most Queue checks wait for a bcrypt slot, none longer than
//     QueueWait; the others are refused without a check;
//   - the checks waiting are served by their address's misses, fewest
//     first: its logins lately that did not succeed, refused ones
//     included, the count falling by one per FailureInterval like the
//     debt. A check may take the place of the waiter with the most misses
//     in a full queue. A device that tries now and then goes ahead of an
//     address that hammers, even before any of that address's checks ran:
//     a device that logs in for the first time during a flood waits for a
//     check or two, not for the attackers'. A refusal for a full queue is
//     a miss but not a failure: no guess was tested.
//
// A remembered success (the cache) needs no slot, so a device that logged
// in since the start connects at once whatever the queue holds.

// LoginLimits bound the password checks of failed logins: the login:
// part of the configuration file's broker: section.
type LoginLimits struct {
	Queue           int           `yaml:"queue"`            // checks that may wait for a bcrypt slot; more are refused at once
	QueueWait       time.Duration `yaml:"queue_wait"`       // longest a check waits for a bcrypt slot before it is refused
	Failures        int           `yaml:"failures"`         // failed logins an address may owe before it is refused without a check
	FailureInterval time.Duration `yaml:"failure_interval"` // one failure an address owes is forgiven per interval
	Sources         int           `yaml:"sources"`          // addresses whose failures are remembered; the oldest is forgotten first
}

// sourceBytes is about what a remembered address costs: its entry (the
// address, the debt, when it was last touched, two list links) and its map
// slot. TestSourceBytes measures it.
const sourceBytes = 160

// DefaultLoginLimits returns the limits a configuration file leaves out.
func DefaultLoginLimits() LoginLimits {
	return LoginLimits{
		// On a Pi Zero 2 W three slots check ten passwords a second,
		// so 32 waiting checks are served within about 3 s: a device
		// that was turned away tries again soon after.
		Queue: 32,
		// A check that waited this long is more likely a flood than a
		// device; a device's own connect timeout is usually 10-30 s.
		QueueWait: 5 * time.Second,
		// Ten mistakes cover a person typing a password and a device
		// retrying a few times with an old one; then one guess a
		// minute, 1,440 a day, is all an address gets.
		Failures:        10,
		FailureInterval: time.Minute,
		// 4,096 addresses, well above a LAN's devices, in about 640 KiB.
		Sources: 4096,
	}
}

// Check reports the limits' problems to k, under path (broker.login).
func (l LoginLimits) Check(k *check.Checker, path string) {
	k.IntRange(path+".queue", l.Queue, 0, 1<<16, "32, or 0 to refuse a check when every bcrypt slot is busy")
	if d := l.QueueWait; d < 10*time.Millisecond || d > time.Minute {
		k.Fail(path+".queue_wait", "%s is out of range; use 10ms to 1m, such as 5s", d)
	}
	k.IntRange(path+".failures", l.Failures, 1, 1<<16, "10")
	if d := l.FailureInterval; d < time.Second || d > 24*time.Hour {
		k.Fail(path+".failure_interval", "%s is out of range; use 1s to 24h, such as 1m", d)
	}
	k.IntRange(path+".sources", l.Sources, 1, 1<<20, fmt.Sprintf("4096 (about %d bytes each)", sourceBytes))
}

// Outcome is what CheckFrom decided.
type Outcome uint8

// The outcomes of CheckFrom. Every one but Accepted refuses the login;
// only WrongPassword ran a check.
const (
	Accepted      Outcome = iota // the password is the user's
	WrongPassword                // checked, and it is not, or the user is unknown, or the password is empty or too long
	Limited                      // the address failed too often lately: refused without a check
	QueueFull                    // too many checks were waiting for bcrypt: refused without a check
	QueueTimeout                 // waited LoginLimits.QueueWait for bcrypt: refused without a check
	nOutcomes
)

var outcomeNames = [nOutcomes]string{"accepted", "password", "limited", "queue_full", "queue_timeout"}

// String names the outcome as /metrics does: accepted, password, limited,
// queue_full or queue_timeout.
func (o Outcome) String() string {
	if o < nOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// Unchecked reports whether the login was refused without checking its
// password: the client is not told its password is wrong, only that it
// may not log in now.
func (o Outcome) Unchecked() bool { return o >= Limited }

// NewLimitedAuthenticator returns an Authenticator whose failed logins are
// bounded by l, with one bcrypt slot fewer than the CPUs (at least one).
// l must have passed its Check.
func NewLimitedAuthenticator(l LoginLimits) *Authenticator {
	return &Authenticator{
		slots:   newSlotQueue(max(1, runtime.NumCPU()-1), l.Queue, l.QueueWait),
		sources: newSourceTable(l),
		cache:   newCache(cacheSize),
	}
}

// Refused returns how many logins a has refused since it was made, by
// reason (the names of Outcome.String), every reason present.
func (a *Authenticator) Refused() map[string]int64 {
	m := make(map[string]int64, nOutcomes-1)
	for o := WrongPassword; o < nOutcomes; o++ {
		m[o.String()] = a.refused[o].Load()
	}
	return m
}

// CheckFrom reports whether password is user's, as Check does, for a
// login from the address from (the zero Addr for one with no address,
// such as a unix socket's, which no failure limit applies to). An address
// that failed too often lately, or a check that finds the bcrypt queue
// full or waits too long in it, is refused without a check.
func (p *Passwords) CheckFrom(from netip.Addr, user string, password []byte) Outcome {
	if p == nil {
		return WrongPassword
	}
	a := p.auth
	o := p.checkFrom(from, user, password)
	if o != Accepted {
		a.refused[o].Add(1)
	}
	return o
}

func (p *Passwords) checkFrom(from netip.Addr, user string, password []byte) Outcome {
	a := p.auth
	// The address is asked first, even for a remembered password: a
	// limited address that could still test guesses against the cache
	// would have a password oracle at network speed.
	misses, ok := a.sources.take(from)
	if !ok {
		return Limited
	}
	if len(password) == 0 || len(password) > MaxPasswordLen {
		return WrongPassword
	}
	c := a.cache
	hash, known := p.users[user]
	sum := c.sum(password)
	if known && c.hit(user, hash, sum) {
		a.sources.refund(from)
		return Accepted
	}
	target := hash
	if !known {
		target = p.dummy
	}
	if o := a.slots.acquire(misses); o != Accepted {
		// No guess was tested: the address owes nothing for it.
		a.sources.turnedAway(from)
		return o
	}
	err := bcrypt.CompareHashAndPassword([]byte(target), password)
	a.slots.release()
	if !known || err != nil {
		return WrongPassword
	}
	c.add(user, hash, sum)
	// Only the reservation is paid back, not earlier failures: else a
	// client with one account of its own could wipe its debt between
	// guesses at another's.
	a.sources.refund(from)
	return Accepted
}

// Source returns the address a login comes from, for CheckFrom: the host
// of a host:port such as net.Conn.RemoteAddr().String() or
// http.Request.RemoteAddr gives, or of a *net.TCPAddr. IPv4 addresses
// written as IPv6 become IPv4 and zones are dropped, so that one host is
// one source. It is the zero Addr when there is none (a unix socket).
func Source(addr any) netip.Addr {
	var a netip.Addr
	switch v := addr.(type) {
	case *net.TCPAddr:
		a = v.AddrPort().Addr()
	case net.Addr:
		return Source(v.String())
	case string:
		if ap, err := netip.ParseAddrPort(v); err == nil {
			a = ap.Addr()
		} else if ip, err := netip.ParseAddr(v); err == nil {
			a = ip
		}
	}
	return a.Unmap().WithZone("")
}

// slotQueue bounds the bcrypt checks running at once and those waiting
// for a slot. Waiters are served by their address's misses, fewest first,
// and in order among equals.
type slotQueue struct {
	mu   sync.Mutex
	free int           // slots not in use
	max  int           // waiters
	wait time.Duration // longest wait
	line []*waiter     // oldest first
}

// A waiter is handed a slot (true), or turned away (false) by a check
// with fewer misses that took its place.
type waiter struct {
	misses float64
	got    chan bool
}

func newSlotQueue(slots, max int, wait time.Duration) *slotQueue {
	return &slotQueue{free: slots, max: max, wait: wait}
}

// acquire takes a slot, waiting for one in turn, and returns Accepted, or
// QueueFull or QueueTimeout without a slot.
func (q *slotQueue) acquire(misses float64) Outcome {
	q.mu.Lock()
	if q.free > 0 {
		// Waiters are handed slots as they free up, so a free slot
		// means nobody waits.
		q.free--
		q.mu.Unlock()
		return Accepted
	}
	if len(q.line) >= q.max {
		worst := -1
		for i, w := range q.line {
			if worst < 0 || w.misses >= q.line[worst].misses {
				worst = i
			}
		}
		if worst < 0 || q.line[worst].misses <= misses {
			q.mu.Unlock()
			return QueueFull
		}
		q.line[worst].got <- false
		q.line = slices.Delete(q.line, worst, worst+1)
	}
	w := &waiter{misses: misses, got: make(chan bool, 1)}
	q.line = append(q.line, w)
	q.mu.Unlock()
	t := time.NewTimer(q.wait)
	defer t.Stop()
	select {
	case got := <-w.got:
		return slotOutcome(got)
	case <-t.C:
	}
	q.mu.Lock()
	i := slices.Index(q.line, w)
	if i >= 0 {
		q.line = slices.Delete(q.line, i, i+1)
	}
	q.mu.Unlock()
	if i >= 0 {
		return QueueTimeout
	}
	// Handed a slot, or turned away, just as the wait ran out.
	return slotOutcome(<-w.got)
}

func slotOutcome(got bool) Outcome {
	if got {
		return Accepted
	}
	return QueueFull
}

// release gives a slot back, to the waiter with the fewest misses if
// there is one.
func (q *slotQueue) release() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.line) == 0 {
		q.free++
		return
	}
	best := 0
	for i, w := range q.line {
		if w.misses < q.line[best].misses {
			best = i
		}
	}
	q.line[best].got <- true
	q.line = slices.Delete(q.line, best, best+1)
}

// sourceTable remembers the failures of recent source addresses, at most
// max of them: each owes a debt of failures, and counts its misses (logins
// that did not succeed, checked or not), both falling by one per
// interval. An address whose debt would pass burst is limited. The
// entries form a list from least to most recently used, so the one
// forgotten to make room is the one touched longest ago.
type sourceTable struct {
	mu       sync.Mutex
	burst    float64
	interval time.Duration
	max      int
	epoch    time.Time // entries keep their time as an offset from it
	m        map[netip.Addr]*source
	old, new *source // the list's ends
}

type source struct {
	addr       netip.Addr
	debt       float64       // failures owed, a check under way counting as one
	misses     float64       // logins that did not succeed, one under way counting as one
	at         time.Duration // since epoch, when debt and misses were last brought up to date
	prev, next *source
}

func newSourceTable(l LoginLimits) *sourceTable {
	return &sourceTable{
		burst: float64(l.Failures), interval: l.FailureInterval, max: l.Sources,
		epoch: time.Now(), m: make(map[netip.Addr]*source),
	}
}

// take charges from one failure and one miss ahead of a check, which
// refund pays back when the login succeeds (turnedAway only the failure,
// when no check ran). It returns the address's misses before this login;
// ok is false, and only the miss is charged, when the address is limited.
// A new address that takes the place of one forgotten starts with that
// one's misses: an attacker with more addresses than the table holds gets
// no place ahead of anyone.
func (t *sourceTable) take(from netip.Addr) (misses float64, ok bool) {
	if t == nil || !from.IsValid() {
		return 0, true
	}
	now := time.Since(t.epoch)
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[from]
	if s == nil {
		s = &source{addr: from, at: now}
		if len(t.m) >= t.max {
			o := t.old
			t.settle(o, now)
			s.misses = o.misses
			t.unlink(o)
			delete(t.m, o.addr)
		}
		t.m[from] = s
	} else {
		t.settle(s, now)
		t.unlink(s)
	}
	t.pushNew(s)
	misses = s.misses
	s.misses++
	if s.debt+1 > t.burst {
		return misses, false
	}
	s.debt++
	return misses, true
}

// refund pays back what take charged, for a login that succeeded.
func (t *sourceTable) refund(from netip.Addr) {
	if t == nil || !from.IsValid() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[from]; s != nil {
		s.debt = max(0, s.debt-1)
		s.misses = max(0, s.misses-1)
	}
}

// turnedAway pays back the failure take charged, for a login refused
// without a check; the miss stays.
func (t *sourceTable) turnedAway(from netip.Addr) {
	if t == nil || !from.IsValid() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.m[from]; s != nil {
		s.debt = max(0, s.debt-1)
	}
}

// settle brings s's debt up to now.
func (t *sourceTable) settle(s *source, now time.Duration) {
	paid := float64(now-s.at) / float64(t.interval)
	s.debt = max(0, s.debt-paid)
	s.misses = max(0, s.misses-paid)
	s.at = now
}

func (t *sourceTable) unlink(s *source) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		t.old = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		t.new = s.prev
	}
	s.prev, s.next = nil, nil
}

func (t *sourceTable) pushNew(s *source) {
	s.prev = t.new
	if t.new != nil {
		t.new.next = s
	} else {
		t.old = s
	}
	t.new = s
}

// len is the number of addresses remembered.
func (t *sourceTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// refusedCounts are the refusals by Outcome; index Accepted is unused.
type refusedCounts [nOutcomes]atomic.Int64
