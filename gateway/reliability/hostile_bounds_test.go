package reliability

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit/memcap"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The unit's memory bounds (systemd/fieldgate.service): the cap the
// kernel enforces, and the Go collector's target below it.
const (
	unitMemoryMax  = 192 << 20
	unitGoMemLimit = "140MiB"
)

// boundsGatewayYAML runs the broker with its default bounds: what is
// measured is what a packaged gateway would hold. Anonymous clients may
// claim any user name, as on a LAN with no password file: an attacker
// can spread its sessions and retained messages over many "users".
var boundsGatewayYAML = plainYAML("")

// TestHostileBounds: hostile clients push persistent sessions, filter
// bytes and retained messages past the broker's default bounds, from many
// connections at once and claiming many user names, with the gateway
// under the unit's MemoryMax. Every push past a bound is refused with its
// reason code, the gateway stays up and serves a control client, and the
// memory and state file it reached are recorded. Without the bounds the
// same attack holds 1,500 sessions with 75 KiB of filters each and
// 160 MB of retained payloads, past the cap.
func TestHostileBounds(t *testing.T) {
	rec := relrecord.Begin(t, "hostile", "sessions, filters, retained past their bounds")
	t.Setenv("GOMEMLIMIT", unitGoMemLimit) // as the unit sets it
	g := newGatewayYAML(t, buildGateway(t, t.TempDir()), boundsGatewayYAML)
	g.start()
	cg, err := memcap.New(unitMemoryMax)
	if err == nil {
		defer cg.Close()
		err = cg.Add(g.pid())
	}
	if err != nil {
		cg = nil
		rec.Add("memory cap", "not applied (%v): RSS measured only", err)
	} else {
		rec.Add("memory cap", "%s (MemoryMax=192M), GOMEMLIMIT=%s", cg, unitGoMemLimit)
	}
	// alive fails the test, saying why, once the gateway is gone: under
	// the cap, without bounds, the kernel's OOM killer ends it.
	alive := func(phase string) {
		t.Helper()
		select {
		case <-g.exited:
		default:
			return
		}
		why := fmt.Sprint(g.cmd.ProcessState)
		if cg != nil {
			if u, err := cg.Usage(); err == nil {
				why += fmt.Sprintf("; the cgroup's OOM killer ran %d times, peak %.1f MiB", u.OOMKills, mib(u.Peak))
			}
		}
		rec.Fail("the gateway died in the %s phase: %s", phase, why)
		t.Fatalf("the gateway died in the %s phase: %s", phase, why)
	}
	rss0 := g.rss()
	// The gateway's own retained messages (its availability) are
	// counted too.
	own := int(g.metric("fieldgate_broker_retained_bound_messages"))
	start := time.Now()

	// Sessions: one user takes more than its share, then five more
	// users together more than the total.
	greedy := attackSessions(t, g, []string{"greedy"}, 400)
	others := attackSessions(t, g, []string{"u0", "u1", "u2", "u3", "u4"}, 220)
	rec.Add("persistent sessions", "%d tried, %d held, %d refused 0x97 (%d of them past the per-user bound)",
		greedy.tried+others.tried, greedy.held+others.held, greedy.refused+others.refused, greedy.refused)
	if greedy.held != 250 || greedy.refused != 150 || others.held != 750 || others.refused != 350 {
		t.Errorf("sessions: greedy user %d held, %d refused (want 250, 150); others %d held, %d refused (want 750, 350)",
			greedy.held, greedy.refused, others.held, others.refused)
	}
	rec.Add("filters per session", "100 sent, 50 of 2,000 bytes refused 0x8F, 16 of 1,000 granted, 34 refused 0x97 past 16 KiB: codes %s", others.subacks)
	if n := greedy.badSubacks + others.badSubacks; n > 0 {
		t.Errorf("%d sessions had other SUBACK codes than 0x8F for the long filters, 16 granted, 0x97 past 16 KiB; last %s", n, others.subacks)
	}
	alive("sessions")
	rec.Add("sessions phase", "%s, RSS %.1f MiB", time.Since(start).Round(time.Millisecond), mib(g.rss()))

	// Retained: big payloads from one hoarding user, then from six
	// more, past the bytes; the hoarder deletes its own, which frees
	// them, and five users send many tiny ones past the count.
	big := strings.Repeat("R", 200_000)
	hoard := attackRetained(t, g, []string{"hoarder"}, 30, "big", big)
	bigs := attackRetained(t, g, []string{"r0", "r1", "r2", "r3", "r4", "r5"}, 128, "big", big)
	rec.Add("retained 200 kB", "%d tried (%.0f MB), %d stored, %d refused 0x97 (%d past the per-user 4 MiB)",
		hoard.tried+bigs.tried, float64(hoard.tried+bigs.tried)*0.2, hoard.held+bigs.held, hoard.refused+bigs.refused, hoard.refused)
	// Each counts its payload, its topic of about 20 bytes and 64: 20
	// fit in a user's 4 MiB, 83 in the 16 MiB of all users.
	if hoard.held != 20 || hoard.refused != 10 || hoard.held+bigs.held != 83 {
		t.Errorf("retained 200 kB: hoarder %d stored, %d refused (want 20, 10); %d stored in all (want 83)",
			hoard.held, hoard.refused, hoard.held+bigs.held)
	}
	alive("retained")
	fullBytes := g.metric("fieldgate_broker_retained_bytes")
	if del := attackRetained(t, g, []string{"hoarder"}, 30, "big", ""); del.held != 30 {
		t.Errorf("the hoarder's deletes: %d of 30 acknowledged with 0", del.held)
	}
	tiny := attackRetained(t, g, []string{"t0", "t1", "t2", "t3", "t4"}, 2500, "tiny", "x")
	rec.Add("retained tiny", "%d tried after the hoarder deleted its 20, %d stored, %d refused 0x97", tiny.tried, tiny.held, tiny.refused)
	if n := g.metric("fieldgate_broker_retained_bound_messages"); n != 10000 || tiny.held != 10000-63-own {
		t.Errorf("retained messages: %v counted, %d tiny stored; want 10,000 (broker.max_retained_messages), %d tiny", n, tiny.held, 10000-63-own)
	}
	if n := hoard.other + bigs.other + tiny.other; n > 0 {
		t.Errorf("%d retained publishes got an acknowledgement other than 0 or 0x97", n)
	}

	// The gateway is up and serves a control client; its metrics count
	// what it refused.
	alive("tiny retained")
	controlRoundTrip(t, g)
	took := time.Since(start)
	refusals := g.labelled("fieldgate_broker_bound_refusals_total", "bound")
	rec.Add("refusals in /metrics", "%v", refusals)
	for kind, want := range map[string]float64{
		"persistent_sessions": 350, "persistent_sessions_per_user": 150,
		"filter_bytes": 50 * 1000, "session_filter_bytes": 34 * 1000,
	} {
		if refusals[kind] != want {
			t.Errorf("/metrics refusals of %s: %v, want %v", kind, refusals[kind], want)
		}
	}
	if g.metric("fieldgate_broker_persistent_sessions") != 1000 {
		t.Errorf("persistent sessions gauge %v, want 1000", g.metric("fieldgate_broker_persistent_sessions"))
	}
	retainedBytes := g.metric("fieldgate_broker_retained_bytes")
	if fullBytes > 16<<20 || fullBytes < 16<<20-200_100 {
		t.Errorf("retained bytes when full: %v, want within one message of 16 MiB", fullBytes)
	}

	fi, err := os.Stat(g.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	peak := g.status("VmHWM")
	rec.Add("attack", "%s in all", took.Round(time.Millisecond))
	rec.Add("RSS", "%.1f MiB at start, %.1f MiB peak; now %.1f MiB, of which %.1f MiB the heap and stacks (RssAnon), the rest the state file's mapped pages",
		mib(rss0), mib(peak), mib(g.rss()), mib(g.status("RssAnon")))
	rec.Add("retained bytes counted", "%.2f MiB when full (bound 16 MiB), %.2f MiB at the end", fullBytes/(1<<20), retainedBytes/(1<<20))
	rec.Add("state file", "%.1f MiB", mib(fi.Size()))
	if peak > unitMemoryMax {
		t.Errorf("peak RSS %.1f MiB is over MemoryMax", mib(peak))
	}
	if cg != nil {
		u, err := cg.Usage()
		if err != nil {
			t.Error(err)
		}
		rec.Add("cgroup", "peak %.1f MiB of %.0f MiB (RSS and page cache of the state file), limit hit %d times, %d OOM kills",
			mib(u.Peak), mib(u.Limit), u.Failcnt, u.OOMKills)
		if u.OOMKills > 0 {
			t.Errorf("the OOM killer ran in the gateway's cgroup %d times", u.OOMKills)
		}
	}

	// A restart restores it all, over no bound, and serves again.
	g.kill()
	restart := time.Now()
	g.start()
	rec.Add("restart", "ready in %s, RSS %.1f MiB (RssAnon %.1f MiB)", time.Since(restart).Round(time.Millisecond), mib(g.rss()), mib(g.status("RssAnon")))
	if got := g.metric("fieldgate_broker_persistent_sessions"); got != 1000 {
		t.Errorf("after restart: %v persistent sessions, want 1000", got)
	}
	if got := g.metric("fieldgate_broker_retained_bytes"); got != retainedBytes {
		t.Errorf("after restart: %v retained bytes, want %v", got, retainedBytes)
	}
	controlRoundTrip(t, g)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// attackResult counts what one attack phase achieved.
type attackResult struct {
	tried, held, refused, other int
	subacks                     string // the last SUBACK's codes, summed up
	badSubacks                  int
}

// attackWorkers is how many connections an attack runs at once.
const attackWorkers = 16

// attackSessions opens perUser persistent sessions for each user, each
// subscribing to 50 filters of 2,000 bytes and 50 of 1,000, all distinct.
func attackSessions(t *testing.T, g *gateway, users []string, perUser int) attackResult {
	t.Helper()
	var mu sync.Mutex
	var res attackResult
	jobs := make(chan string)
	var wg sync.WaitGroup
	for range attackWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range jobs {
				r := sessionAttack(g, id)
				mu.Lock()
				res.tried++
				switch {
				case r.err != nil:
					res.other++
					t.Errorf("%s: %v", id, r.err)
				case r.refused:
					res.refused++
				default:
					res.held++
					res.subacks = r.summary
					if !r.ok {
						res.badSubacks++
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, u := range users {
		for i := range perUser {
			jobs <- u + "|" + strconv.Itoa(i)
		}
	}
	close(jobs)
	wg.Wait()
	return res
}

type sessionOutcome struct {
	refused bool
	ok      bool
	summary string
	err     error
}

func sessionAttack(g *gateway, job string) sessionOutcome {
	user, n, _ := strings.Cut(job, "|")
	id := "attacker-" + user + "-" + n
	c, _, err := dialAs(g.addr, id, user, "", true, sessionExpiry, 0)
	if err != nil {
		if strings.Contains(err.Error(), "CONNACK 0x97") {
			return sessionOutcome{refused: true}
		}
		return sessionOutcome{err: err}
	}
	defer c.close()
	var subs packets.Subscriptions
	for i := range 100 {
		size := 1000
		if i%2 == 0 {
			size = 2000
		}
		f := fmt.Sprintf("%s/%d/", id, i)
		subs = append(subs, packets.Subscription{Filter: f + strings.Repeat("f", size-len(f)), Qos: 1})
	}
	if err := c.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: 1, Filters: subs}); err != nil {
		return sessionOutcome{err: err}
	}
	pk, err := c.read(ioTimeout)
	if err != nil || pk.FixedHeader.Type != packets.Suback {
		return sessionOutcome{err: fmt.Errorf("waiting for SUBACK: %v", err)}
	}
	counts := map[byte]int{}
	granted := 0
	for i, code := range pk.ReasonCodes {
		counts[code]++
		if i%2 == 1 && code == 1 {
			granted++
		}
	}
	ok := len(pk.ReasonCodes) == 100 && counts[0x8F] == 50 && counts[1] == 16 && granted == 16 && counts[0x97] == 34
	c.disconnect()
	return sessionOutcome{ok: ok, summary: fmt.Sprintf("%v", counts)}
}

// attackRetained has each user publish perUser retained messages of
// payload (empty: deletes) at QoS 1 on topics of its own named by tag,
// 32 unacknowledged at a time, and counts the PUBACK codes.
func attackRetained(t *testing.T, g *gateway, users []string, perUser int, tag, payload string) attackResult {
	t.Helper()
	var mu sync.Mutex
	var res attackResult
	var wg sync.WaitGroup
	for _, u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, _, err := dialAs(g.addr, "retainer-"+u+"-"+tag, u, "", true, 0, 0)
			if err != nil {
				t.Errorf("%s: %v", u, err)
				return
			}
			defer c.close()
			codes := map[byte]int{}
			var sent, acked atomic.Int64
			done := make(chan error, 1)
			go func() {
				for acked.Load() < int64(perUser) {
					pk, err := c.read(ioTimeout)
					if err != nil {
						done <- err
						return
					}
					if pk.FixedHeader.Type == packets.Puback {
						codes[pk.ReasonCode]++
						acked.Add(1)
					}
				}
				done <- nil
			}()
			for i := range perUser {
				for sent.Load()-acked.Load() >= 32 {
					time.Sleep(time.Millisecond)
				}
				topic := fmt.Sprintf("attack/%s/%s/%d", u, tag, i)
				if err := c.write(&packets.Packet{
					FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: true},
					TopicName:   topic, Payload: []byte(payload), PacketID: uint16(i%60000 + 1),
				}); err != nil {
					t.Errorf("%s: %v", u, err)
					return
				}
				sent.Add(1)
			}
			if err := <-done; err != nil {
				t.Errorf("%s: waiting for PUBACKs: %v", u, err)
			}
			mu.Lock()
			defer mu.Unlock()
			res.tried += perUser
			res.held += codes[0]
			res.refused += codes[0x97]
			res.other += perUser - codes[0] - codes[0x97]
		}()
	}
	wg.Wait()
	return res
}

// controlRoundTrip: a client that attacks nothing connects, subscribes
// and gets its own QoS 1 message back, each within ioTimeout.
func controlRoundTrip(t *testing.T, g *gateway) {
	t.Helper()
	c, _, err := dial(g.addr, "control", true, 0, 0)
	if err != nil {
		t.Fatalf("control client: %v", err)
	}
	defer c.close()
	if err := c.subscribe("control/echo", 1); err != nil {
		t.Fatalf("control client: %v", err)
	}
	if err := c.publish("control/echo", "ping", 1, 7, false); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 2; {
		pk, err := c.read(ioTimeout)
		if err != nil {
			t.Fatalf("control client: waiting for its PUBACK and message: %v", err)
		}
		switch pk.FixedHeader.Type {
		case packets.Puback:
			got++
		case packets.Publish:
			got++
			_ = c.ack(packets.Puback, pk.PacketID)
		}
	}
}

// labelled returns the samples of a family by the value of one label.
func (g *gateway) labelled(name, label string) map[string]float64 {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.opsAddr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	prefix := name + "{" + label + "=\""
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		val, num, ok := strings.Cut(rest, "\"} ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(num), 64); err == nil {
			out[val] = v
		}
	}
	return out
}

// status returns a kB field of /proc/PID/status (VmHWM: the peak RSS) in
// bytes.
func (g *gateway) status(field string) int64 {
	g.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.pid()))
	if err != nil {
		g.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
