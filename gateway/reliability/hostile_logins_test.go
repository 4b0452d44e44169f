package reliability

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The wrong-password flood: many clients guessing passwords must not keep
// the devices that know theirs out.
const (
	// loginAttackers guess passwords from loginSpread addresses, a few
	// each, and loginHeavy more from one address of their own.
	loginAttackers = 400
	loginHeavy     = 100
	loginSpread    = 100
	// loginRetry is how long a device waits after a refusal before it
	// tries again, as a device's firmware would.
	loginRetry = 100 * time.Millisecond
	// loginQueueWait is broker.login.queue_wait's default: by then every
	// check of the flood's first wave has run or been refused.
	loginQueueWait = 5 * time.Second
)

var (
	// loginKnownMax bounds the wait of a device that logged in before the
	// flood (its check is remembered), loginNewMax that of a device that
	// logs in for the first time during it: before the bounds on the
	// bcrypt queue, the second waited 32-38 s behind 400 attackers.
	loginKnownMax = testkit.Scale(time.Second)
	loginNewMax   = testkit.Scale(5 * time.Second)
	// loginGiveUp is when a device stops trying: far past both bounds.
	loginGiveUp = testkit.Scale(90 * time.Second)
)

// loginAddr is a loopback address of its own for each source: Linux
// routes all of 127.0.0.0/8 to the loopback interface.
func loginAddr(a, b, c byte) netip.Addr { return netip.AddrFrom4([4]byte{127, a, b, c}) }

// TestWrongPasswordFlood floods the gateway with wrong passwords from 101
// source addresses (400 clients, 100 of them on one address) and meanwhile
// has a device that logged in before the flood reconnect, and a device
// that never logged in connect for the first time, each from an address
// of its own. Both must get in within their bounds; every attacker must be
// refused; the heavy address must be refused without checks once it has
// failed too often, over MQTT and over the ops endpoint's basic auth
// alike.
func TestWrongPasswordFlood(t *testing.T) {
	rec := relrecord.Begin(t, "hostile", "wrong-password flood")
	rec.Add("attack", "%d clients guessing passwords for 3 users (half MQTT 5, half 3.1.1), reconnecting at once after each refusal: %d from one address, %d spread over %d addresses",
		loginAttackers, loginHeavy, loginAttackers-loginHeavy, loginSpread)

	bin := buildGateway(t, t.TempDir())
	pwDir := t.TempDir()
	pwFile := filepath.Join(pwDir, "passwd")
	var entries strings.Builder
	for _, u := range []string{"dev-a", "dev-b", "probe"} {
		h, err := auth.HashPassword([]byte("right-" + u))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&entries, "%s:%s\n", u, h)
	}
	if err := os.WriteFile(pwFile, []byte(entries.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// Anonymous clients are allowed so that the harness's probe can see
	// the gateway start; every client that names a user is checked.
	// The log at warn: a flood's refusals at info would be most of it.
	cfg := plainYAML(fmt.Sprintf("  password_file: %q\n", pwFile))
	g := newGatewayYAML(t, bin, strings.Replace(cfg, "level: info", "level: warn", 1))
	g.start()

	devA, devB := loginAddr(3, 0, 1), loginAddr(3, 0, 2)
	// One uncached check, to put the figures below in scale.
	t0 := time.Now()
	if code, err := loginOnce(g.addr, loginAddr(3, 0, 3), "probe", "right-probe", true); err != nil || code != 0 {
		t.Fatalf("probe login: code 0x%02x, %v", code, err)
	}
	rec.Add("one check", "a first login with the right password took %s before the flood", time.Since(t0).Round(time.Millisecond))
	if code, err := loginOnce(g.addr, devA, "dev-a", "right-dev-a", true); err != nil || code != 0 {
		t.Fatalf("dev-a's first login: code 0x%02x, %v", code, err)
	}

	// The flood.
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		codes    = map[string]int{} // "v5 0x86" → count
		answered = map[netip.Addr]int{}
		dialErrs atomic.Int64
		accepted atomic.Int64
	)
	heavy := loginAddr(2, 0, 1)
	users := []string{"dev-a", "dev-b", "admin"}
	began := time.Now()
	for i := range loginAttackers {
		src := heavy
		if i >= loginHeavy {
			src = loginAddr(1, 0, byte(1+(i-loginHeavy)%loginSpread))
		}
		v5 := i%2 == 0
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				code, err := loginOnce(g.addr, src, users[(i+n)%len(users)], fmt.Sprintf("guess-%d-%d", i, n), v5)
				if err != nil {
					dialErrs.Add(1)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if code == 0 {
					accepted.Add(1)
				}
				mu.Lock()
				codes[fmt.Sprintf("v%d 0x%02x", map[bool]int{true: 5, false: 4}[v5], code)]++
				answered[src]++
				mu.Unlock()
			}
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()

	// The devices come once every attacking address has had an answer
	// and the checks then waiting are done: the flood is in full swing,
	// and no attacking address is new to the gateway.
	warm := time.Now().Add(loginGiveUp)
	for {
		mu.Lock()
		n := len(answered)
		mu.Unlock()
		if n == loginSpread+1 || time.Now().After(warm) {
			rec.Add("flood under way", "%d of %d attacking addresses answered %s after the flood began", n, loginSpread+1, time.Since(began).Round(time.Millisecond))
			time.Sleep(loginQueueWait)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	type wait struct {
		took  time.Duration
		tries int
		err   error
	}
	var a, b wait
	var devices sync.WaitGroup
	devices.Go(func() { a.took, a.tries, a.err = loginUntil(g.addr, devA, "dev-a", "right-dev-a") })
	devices.Go(func() { b.took, b.tries, b.err = loginUntil(g.addr, devB, "dev-b", "right-dev-b") })
	devices.Wait()
	rec.Add("known device", "dev-a, logged in before the flood, got in after %s (%d tries)", a.took.Round(time.Millisecond), a.tries)
	rec.Add("new device", "dev-b, never logged in before, got in after %s (%d tries)", b.took.Round(time.Millisecond), b.tries)

	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(began)
	mu.Lock()
	total := 0
	for _, n := range answered {
		total += n
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range codes {
			if !yield(k) {
				return
			}
		}
	})
	var seen []string
	for _, k := range keys {
		seen = append(seen, fmt.Sprintf("%s ×%d", k, codes[k]))
	}
	heavyAnswered := answered[heavy]
	mu.Unlock()
	rec.Add("attempts", "%d answered in %s (%.0f/s), %d from the heavy address; %d dial errors; CONNACK codes: %s",
		total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), heavyAnswered, dialErrs.Load(), strings.Join(seen, ", "))
	var reasons []string
	for _, r := range []string{"password", "limited", "queue_full", "queue_timeout"} {
		v, ok := hostileMetricOK(t, g, fmt.Sprintf(`fieldgate_broker_logins_refused_total{reason=%q}`, r))
		if ok {
			reasons = append(reasons, fmt.Sprintf("%s %.0f", r, v))
		}
	}
	rec.Add("refused logins", "%s", strings.Join(reasons, ", "))

	// The ops endpoint's basic auth counts an address's failures with the
	// MQTT logins', once the flood is over and its checks run: from a
	// fresh address, the wrong passwords past the limit are refused
	// without a check, and so is then an MQTT login from it.
	opsSrc := loginAddr(4, 0, 1)
	limitedBefore, _ := hostileMetricOK(t, g, `fieldgate_broker_logins_refused_total{reason="limited"}`)
	// Two past broker.login.failures' default of 10.
	const opsTries = 12
	for i := range opsTries {
		if code := opsLogin(t, g, opsSrc, "dev-a", fmt.Sprintf("guess-%d", i)); code != http.StatusUnauthorized {
			t.Errorf("ops basic auth with a wrong password = %d, want 401", code)
		}
	}
	mqttCode, mqttErr := loginOnce(g.addr, opsSrc, "dev-a", "right-dev-a", true)
	limitedAfter, _ := hostileMetricOK(t, g, `fieldgate_broker_logins_refused_total{reason="limited"}`)
	limitedOps := limitedAfter - limitedBefore

	rec.Add("ops basic auth", "%d wrong logins from one address: %.0f refused without a check; an MQTT login with the right password from it then: code 0x%02x %v",
		opsTries, limitedOps, mqttCode, mqttErr)

	if a.err != nil || a.took > loginKnownMax {
		t.Errorf("the device that had logged in before waited %s (%v); want at most %s", a.took, a.err, loginKnownMax)
		rec.Fail("known device waited %s", a.took)
	}
	if b.err != nil || b.took > loginNewMax {
		t.Errorf("the device logging in for the first time waited %s (%v); want at most %s", b.took, b.err, loginNewMax)
		rec.Fail("new device waited %s", b.took)
	}
	if n := accepted.Load(); n > 0 {
		t.Errorf("%d guesses were accepted", n)
	}
	if limitedOps < 2 {
		t.Errorf("%d wrong ops logins from one address: %.0f refused without a check, want the last 2 at least", opsTries, limitedOps)
	}
	if mqttErr != nil || mqttCode != 0x86 {
		t.Errorf("an MQTT login from an address the ops endpoint limited: code 0x%02x %v, want 0x86", mqttCode, mqttErr)
	}
}

// loginOnce connects from src, logs in as user with password in MQTT 5
// (v5) or 3.1.1, and returns the CONNACK's code.
func loginOnce(addr string, src netip.Addr, user, password string, v5 bool) (byte, error) {
	d := net.Dialer{Timeout: ioTimeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	// A reset, not a FIN: the attackers' many short connections leave no
	// TIME_WAIT behind to run their addresses out of ports.
	_ = nc.(*net.TCPConn).SetLinger(0)
	pk := &packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Connect},
		ProtocolVersion: 4,
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 60,
			UsernameFlag: true, Username: []byte(user),
			PasswordFlag: true, Password: []byte(password),
		},
	}
	if v5 {
		pk.ProtocolVersion = 5
	}
	b, err := mqttwire.Encode(pk)
	if err != nil {
		return 0, err
	}
	_ = nc.SetDeadline(time.Now().Add(loginGiveUp))
	if _, err := nc.Write(b); err != nil {
		return 0, err
	}
	r := bufio.NewReader(nc)
	hb, err := r.ReadByte()
	if err != nil {
		return 0, fmt.Errorf("waiting for CONNACK: %w", err)
	}
	fh, _, err := mqttwire.ReadHeader(hb, r, 0)
	if err != nil {
		return 0, err
	}
	body, err := mqttwire.ReadBody(r, fh.Remaining, nil)
	if err != nil {
		return 0, err
	}
	if fh.Type != packets.Connack || len(body) < 2 {
		return 0, fmt.Errorf("packet type %d of %d bytes instead of CONNACK", fh.Type, len(body))
	}
	return body[1], nil
}

// loginUntil logs in as a device does, trying again loginRetry after each
// refusal, and returns how long it took to get in.
func loginUntil(addr string, src netip.Addr, user, password string) (time.Duration, int, error) {
	start := time.Now()
	for tries := 1; ; tries++ {
		code, err := loginOnce(addr, src, user, password, true)
		if err == nil && code == 0 {
			return time.Since(start), tries, nil
		}
		if time.Since(start) > loginGiveUp {
			return time.Since(start), tries, fmt.Errorf("still refused after %d tries: code 0x%02x %v", tries, code, err)
		}
		time.Sleep(loginRetry)
	}
}

// opsLogin posts an output switch with basic auth from src and returns
// the status code.
func opsLogin(t *testing.T, g *gateway, src netip.Addr, user, password string) int {
	t.Helper()
	d := &net.Dialer{Timeout: ioTimeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	hc := &http.Client{Timeout: loginGiveUp, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequest(http.MethodPost, "http://"+g.opsAddr+"/outputs/pump", strings.NewReader(url.Values{"state": {"on"}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(user, password)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("ops switch: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// hostileMetricOK returns the value of one sample, labels included, from
// the gateway's /metrics, and whether it is there.
func hostileMetricOK(t *testing.T, g *gateway, series string) (float64, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.opsAddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("/metrics line %q: %v", line, err)
			}
			return v, true
		}
	}
	return 0, false
}
