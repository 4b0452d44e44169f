package reliability

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"
)

// Hostile clients against the gateway's logins and its ops endpoint: a
// password file changed under a running gateway, a user switching over
// HTTP what the ACL denies it over MQTT, idle keep-alive connections
// hoarding the ops endpoint, and a stranger reading the status page.

// TestHostileAuthOps runs each case against its own gateway process.
func TestHostileAuthOps(t *testing.T) {
	bin := buildGateway(t, t.TempDir())
	t.Run("passwords", func(t *testing.T) { hostilePasswordReload(t, bin) })
	t.Run("switch-acl", func(t *testing.T) { hostileSwitchACL(t, bin) })
	t.Run("ops-hoard", func(t *testing.T) { hostileOpsHoard(t, bin) })
	t.Run("status-login", func(t *testing.T) { hostileStatusLogin(t, bin) })
}

// passwdFile writes a password file of users and passwords, in pairs,
// with bcrypt at its least cost: the cases test who gets in, and the
// test binary runs under the race detector, where cost 10 takes seconds.
// It returns the lines by user, so that a rewrite can keep one as it was.
func passwdFile(t *testing.T, path string, pairs ...string) map[string]string {
	t.Helper()
	lines := map[string]string{}
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		h, err := bcrypt.GenerateFromPassword([]byte(pairs[i+1]), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		lines[pairs[i]] = pairs[i] + ":" + string(h) + "\n"
		b.WriteString(lines[pairs[i]])
	}
	writePasswd(t, path, b.String())
	return lines
}

func writePasswd(t *testing.T, path, content string) {
	t.Helper()
	// Replaced whole, as fieldgate passwd does.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// authopsYAML is the cases' configuration: a password file, anonymous
// clients allowed (for the harness's own probe), one simulated relay named
// pump on fieldgate/gw/pump/set, and extra broker keys.
func authopsYAML(passwd, brokerExtra string) string {
	return fmt.Sprintf(`log:
  level: info
storage:
  path: %%STATE%%
gateway:
  name: gw
broker:
  allow_anonymous: true
  password_file: %s
  sys_interval: 0s
%slisteners:
  - name: mqtt
    type: tcp
    address: %%ADDR%%
ops:
  address: %%OPS%%
sensors: []
outputs:
  - {name: pump, bus: sim, pin: SIM_OUT0}
`, strconv.Quote(passwd), brokerExtra)
}

// loginAs connects as user with password over MQTT 5, with a clean
// start, and returns the client when the CONNACK accepts it, and the
// CONNACK's reason code.
func loginAs(addr, id, user, password string) (*client, byte, error) {
	c, _, err := dialAs(addr, id, user, password, true, 0, 0)
	if code, ok := refusedCode(err); ok {
		return nil, code, nil
	}
	return c, 0, err
}

// switchPump posts state to the pump's switch with basic auth (none when
// user is empty) and returns the status and body.
func switchPump(t *testing.T, opsAddr, user, password, state string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+opsAddr+"/outputs/pump", strings.NewReader(url.Values{"state": {state}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	return opsDo(t, req)
}

// opsGet fetches path with basic auth (none when user is empty).
func opsGet(t *testing.T, base, path, user, password string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	return opsDo(t, req)
}

func opsDo(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	cl := &http.Client{Timeout: ioTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// awaitDisconnect reads c until the broker ends the connection and
// returns the DISCONNECT's reason code, or -1 when it closed without one
// or did not close.
func awaitDisconnect(c *client) (code int, closed bool) {
	for {
		pk, err := c.read(ioTimeout)
		if err != nil {
			ne, isNet := err.(net.Error)
			return -1, !(isNet && ne.Timeout())
		}
		if pk.FixedHeader.Type == packets.Disconnect {
			_, err := c.read(ioTimeout)
			ne, isNet := err.(net.Error)
			return int(pk.ReasonCode), err != nil && !(isNet && ne.Timeout())
		}
	}
}

// hostilePasswordReload changes the password file under a running gateway
// and sends SIGHUP, as fieldgate passwd's help says to: the removed user
// and the old password must be refused at once, over MQTT and the ops
// endpoint's basic auth, the new password accepted, and the connected
// clients of both disconnected with 0x87. A file broken afterwards must
// keep the users loaded before.
func hostilePasswordReload(t *testing.T, bin string) {
	rec := relrecord.Begin(t, "hostile", "password file reloaded on SIGHUP")
	passwd := filepath.Join(t.TempDir(), "passwd")
	lines := passwdFile(t, passwd, "alice", "a1", "bob", "b1", "carol", "c1")
	g := newGatewayYAML(t, bin, authopsYAML(passwd, ""))
	g.start()
	defer g.stop()

	bob, _, err := loginAs(g.addr, "bob-1", "bob", "b1")
	if err != nil || bob == nil {
		t.Fatalf("bob's login before the change: %v", err)
	}
	defer bob.close()
	carol, _, err := loginAs(g.addr, "carol-1", "carol", "c1")
	if err != nil || carol == nil {
		t.Fatalf("carol's login before the change: %v", err)
	}
	defer carol.close()
	if code, body := switchPump(t, g.opsAddr, "bob", "b1", "on"); code != 200 {
		t.Fatalf("bob's switch before the change = %d %s", code, body)
	}

	// bob's password changes, carol is deleted, dave added; alice's line
	// stays as it was.
	bobNew := passwdFile(t, passwd+".bob", "bob", "b2", "dave", "d1")
	writePasswd(t, passwd, lines["alice"]+bobNew["bob"]+bobNew["dave"])
	start := time.Now()
	g.reload()
	rec.Add("reload", "%s from SIGHUP to the reload logged", time.Since(start).Round(time.Millisecond))

	for _, c := range []struct {
		name string
		cl   *client
	}{{"bob (password changed)", bob}, {"carol (deleted)", carol}} {
		code, closed := awaitDisconnect(c.cl)
		if code != 0x87 || !closed {
			t.Errorf("%s's connection after the reload: DISCONNECT %d (-1: none), closed %v; want 0x87 and closed", c.name, code, closed)
			rec.Fail("%s stayed connected", c.name)
		}
	}
	rec.Add("connected clients of changed users", "disconnected with 0x87 %s after SIGHUP", time.Since(start).Round(time.Millisecond))

	logins := []struct {
		user, password string
		mqtt           byte // CONNACK reason code
		ops            int  // the switch's status
	}{
		{"alice", "a1", 0, 200},
		{"bob", "b1", 0x86, 401},
		{"bob", "b2", 0, 200},
		{"carol", "c1", 0x86, 401},
		{"dave", "d1", 0, 200},
	}
	var got []string
	for _, l := range logins {
		c, code, err := loginAs(g.addr, "after-"+l.user, l.user, l.password)
		if err != nil {
			t.Fatalf("%s: %v", l.user, err)
		}
		if c != nil {
			c.disconnect()
		}
		opsCode, _ := switchPump(t, g.opsAddr, l.user, l.password, "off")
		got = append(got, fmt.Sprintf("%s/%s: MQTT 0x%02x, ops %d", l.user, l.password, code, opsCode))
		if code != l.mqtt || opsCode != l.ops {
			t.Errorf("%s with %q after the reload: CONNACK 0x%02x, switch %d; want 0x%02x and %d", l.user, l.password, code, opsCode, l.mqtt, l.ops)
			rec.Fail("%s/%s: CONNACK 0x%02x, switch %d", l.user, l.password, code, opsCode)
		}
	}
	rec.Add("logins after the reload", "%s", strings.Join(got, "; "))

	// A broken file keeps the users of the last good one.
	writePasswd(t, passwd, "bob:not-a-hash\n")
	g.reload()
	if c, code, err := loginAs(g.addr, "after-broken", "bob", "b2"); err != nil || c == nil {
		t.Errorf("bob refused (0x%02x, %v) after a reload of a broken password file; want the last good file kept", code, err)
		rec.Fail("a broken password file locked bob out")
	} else {
		c.disconnect()
	}
	if !strings.Contains(g.log.lines(400), "password file not reloaded") {
		t.Error("the log does not say the broken password file was not reloaded")
	}
	if strings.Contains(g.log.lines(1<<20), "$2a$") {
		t.Error("the log shows a bcrypt hash")
	}
	rec.Add("broken file", "refused on reload, logged; the users loaded before still log in")
}

// hostileSwitchACL has bob, whom the ACL denies the pump's set topic,
// try it over MQTT (0x87) and then over the ops endpoint with his login:
// 403, logged and counted, the pump untouched; alice, allowed, switches.
// A SIGHUP that grants bob the topic lets him switch.
func hostileSwitchACL(t *testing.T, bin string) {
	rec := relrecord.Begin(t, "hostile", "relay switch under the ACL")
	passwd := filepath.Join(t.TempDir(), "passwd")
	passwdFile(t, passwd, "alice", "a1", "bob", "b1")
	acl := `  acl:
    - {user: alice, topic: "fieldgate/#", access: readwrite}
    - {user: bob, topic: "fieldgate/#", access: read}
`
	g := newGatewayYAML(t, bin, authopsYAML(passwd, acl))
	g.start()
	defer g.stop()

	bob, _, err := loginAs(g.addr, "bob-1", "bob", "b1")
	if err != nil || bob == nil {
		t.Fatalf("bob's login: %v", err)
	}
	if err := bob.publish("fieldgate/gw/pump/set", "ON", 1, 1, false); err != nil {
		t.Fatal(err)
	}
	ack, err := bob.read(ioTimeout)
	if err != nil || ack.FixedHeader.Type != packets.Puback || ack.ReasonCode != 0x87 {
		t.Fatalf("bob's MQTT publish to the pump's set topic: %v %v, want PUBACK 0x87", ack, err)
	}
	bob.disconnect()
	rec.Add("MQTT", "bob's publish to fieldgate/gw/pump/set: PUBACK 0x87")

	code, body := switchPump(t, g.opsAddr, "bob", "b1", "on")
	rec.Add("HTTP", "bob's switch with basic auth: %d %s", code, strings.TrimSpace(body))
	if code != 403 {
		t.Errorf("bob switched the pump over HTTP: %d %s; want 403", code, body)
		rec.Fail("bob switched the pump over HTTP (%d)", code)
	}
	g.awaitLog("refused an output switch")
	if code, body := switchPump(t, g.opsAddr, "alice", "a1", "on"); code != 200 {
		t.Errorf("alice's switch = %d %s, want 200", code, body)
	}

	// The ACL the broker runs now: a reload that lets bob write applies.
	cfg, err := os.ReadFile(g.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	granted := strings.Replace(string(cfg), `{user: bob, topic: "fieldgate/#", access: read}`, `{user: bob, topic: "fieldgate/#", access: readwrite}`, 1)
	if err := os.WriteFile(g.cfgPath, []byte(granted), 0o600); err != nil {
		t.Fatal(err)
	}
	g.reload()
	if code, body := switchPump(t, g.opsAddr, "bob", "b1", "off"); code != 200 {
		t.Errorf("bob's switch after a reload granting him the topic = %d %s, want 200", code, body)
	}
	rec.Add("after SIGHUP granting bob write", "bob's switch: 200")
}

// hostileOpsHoard opens 40 keep-alive connections from one address to
// the ops endpoint and leaves them idle: /healthz, from the same address
// and another, and another address's status page must still be answered
// at once, not after the idle connections time out.
func hostileOpsHoard(t *testing.T, bin string) {
	rec := relrecord.Begin(t, "hostile", "ops endpoint hoarded by idle keep-alive connections")
	passwd := filepath.Join(t.TempDir(), "passwd")
	passwdFile(t, passwd, "alice", "a1")
	g := newGatewayYAML(t, bin, authopsYAML(passwd, ""))
	g.start()
	defer g.stop()

	const hoard = 40
	rssBefore := g.rss()
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range hoard {
		c, err := net.DialTimeout("tcp", g.opsAddr, ioTimeout)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		// One request each, kept alive and then left idle.
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	// Every connection the server has taken has answered by now; the
	// others wait in the backlog (before the fix) or were answered.
	time.Sleep(200 * time.Millisecond)

	// A probe's budget: Kubernetes' default timeout is a second.
	const probeBudget = 2 * time.Second
	cl := &http.Client{Timeout: testkit.Scale(probeBudget)}
	timed := func(what, from, path string, wantCode int) {
		t.Helper()
		tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext, DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		c := *cl
		c.Transport = tr
		start := time.Now()
		resp, err := c.Get("http://" + g.opsAddr + path)
		took := time.Since(start)
		code := 0
		if err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
		rec.Add(what, "%d in %s (%v)", code, took.Round(time.Millisecond), err)
		if code != wantCode {
			t.Errorf("%s with %d idle connections open: %d after %s (%v), want %d within %s", what, hoard, code, took, err, wantCode, probeBudget)
			rec.Fail("%s: %d after %s", what, code, took.Round(time.Millisecond))
		}
	}
	timed("/healthz from the hoarding address", "127.0.0.1", "/healthz", 200)
	timed("/readyz from the hoarding address", "127.0.0.1", "/readyz", 200)
	timed("/healthz from another address", "127.0.0.2", "/healthz", 200)
	timed("status page from another address", "127.0.0.2", "/", 200)

	mu.Lock()
	n := len(conns)
	mu.Unlock()
	rec.Add("hoard", "%d keep-alive connections from 127.0.0.1, each after one request, left idle; RSS %+d KiB", n, (g.rss()-rssBefore)>>10)
	// The scrape comes from another address: the hoarding one has used
	// up its share, and a scrape from it would get 503.
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: ioTimeout}).Get("http://" + g.opsAddr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	limited := 0
	for _, line := range strings.Split(string(metrics), "\n") {
		if strings.HasPrefix(line, "fieldgate_ops_connections_limited_total{") {
			rec.Add("counted", "%s", line)
			limited++
		}
	}
	if limited == 0 {
		t.Error("/metrics has no fieldgate_ops_connections_limited_total")
	}
}

// hostileStatusLogin serves ops on the wildcard address, which is not
// loopback: the status page, which names clients, users and addresses,
// must ask for a login; the probes and /metrics stay open.
func hostileStatusLogin(t *testing.T, bin string) {
	rec := relrecord.Begin(t, "hostile", "status page off loopback needs a login")
	passwd := filepath.Join(t.TempDir(), "passwd")
	passwdFile(t, passwd, "alice", "a1")
	g := newGatewayYAML(t, bin, authopsYAML(passwd, ""))
	// Bind ops to every address; the test still reaches it on 127.0.0.1.
	cfg, err := os.ReadFile(g.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(g.opsAddr)
	wild := strings.Replace(string(cfg), strconv.Quote(g.opsAddr), strconv.Quote("0.0.0.0:"+port), 1)
	if err := os.WriteFile(g.cfgPath, []byte(wild), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	defer g.stop()
	watcher, _, err := loginAs(g.addr, "secret-client-id", "alice", "a1")
	if err != nil || watcher == nil {
		t.Fatalf("alice's login: %v", err)
	}
	defer watcher.disconnect()

	base := "http://" + g.opsAddr
	for _, c := range []struct {
		path, user, password string
		want                 int
	}{
		{"/", "", "", 401},
		{"/", "alice", "wrong", 401},
		{"/", "alice", "a1", 200},
		{"/healthz", "", "", 200},
		{"/readyz", "", "", 200},
		{"/metrics", "", "", 200},
	} {
		code, body := opsGet(t, base, c.path, c.user, c.password)
		rec.Add("GET "+c.path+" as "+cmp.Or(strings.TrimSuffix(c.user+"/"+c.password, "/"), "nobody"), "%d", code)
		if code != c.want {
			t.Errorf("GET %s as %q on a wildcard ops address = %d, want %d", c.path, c.user, code, c.want)
			rec.Fail("GET %s as %q: %d", c.path, c.user, code)
		}
		if c.want != 200 && strings.Contains(body, "secret-client-id") {
			t.Errorf("GET %s as %q shows a client id", c.path, c.user)
		}
	}
}
