package reliability

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// originGatewayYAML runs the gateway the way a developer's laptop would:
// anonymous clients, and a ws listener on loopback only, which a web page
// in the browser on that machine can nevertheless reach. %WS% is the ws
// listener's address.
const originGatewayYAML = `log:
  level: info
storage:
  path: %STATE%
broker:
  allow_anonymous: true
  sys_interval: 0s
listeners:
  - name: mqtt
    type: tcp
    address: %ADDR%
  - name: web
    type: ws
    address: %WS%
    allowed_origins: [https://dashboard.example.com]
ops:
  address: %OPS%
sensors: []
outputs: []
`

// mqttConnect is an MQTT 3.1.1 CONNECT, clean session, client id "page".
var mqttConnect = []byte{0x10, 16, 0, 4, 'M', 'Q', 'T', 'T', 4, 0x02, 0, 60, 0, 4, 'p', 'a', 'g', 'e'}

// TestHostileCrossOriginWebSocket: a page from another origin opens the
// ws listener from the victim's browser (a real WebSocket client sending
// the page's Origin, as a browser does), and, over a raw socket, the DNS
// rebinding variant (Host and Origin both a name the attacker points at
// 127.0.0.1). Every such upgrade gets 403 before any MQTT byte is read,
// is counted in /metrics and logged; clients without an Origin, a page on
// the listener's own loopback host and port, and an origin listed in
// allowed_origins still connect.
func TestHostileCrossOriginWebSocket(t *testing.T) {
	rec := relrecord.Begin(t, "hostile", "cross-origin WebSocket")
	bin := buildGateway(t, t.TempDir())
	ws := testkit.FreeAddr(t)
	g := newGatewayYAML(t, bin, strings.ReplaceAll(originGatewayYAML, "%WS%", fmt.Sprintf("%q", ws)))
	g.start()
	_, port, _ := net.SplitHostPort(ws)

	refused := 0
	// A foreign page, through a real WebSocket client.
	for _, origin := range []string{"http://evil.example", "https://evil.example:" + port, "null", "http://localhost.evil.example:" + port} {
		code := wsDial(t, ws, http.Header{"Origin": {origin}})
		if code != http.StatusForbidden {
			t.Errorf("Origin %s: upgrade answered %d, want 403", origin, code)
			rec.Fail("a page of origin %s was upgraded (%d)", origin, code)
		}
		refused++
	}
	// DNS rebinding: the page's own name, resolved to 127.0.0.1, is the
	// Host; same-origin for the browser, still not this machine's name.
	rebind := "gw-" + port + ".evil.example:" + port
	if code, after := rawUpgrade(t, ws, rebind, "http://"+rebind); code != http.StatusForbidden || after {
		t.Errorf("DNS rebinding (Host and Origin %s): answered %d, CONNACK after it %v; want 403 and none", rebind, code, after)
		rec.Fail("a rebinding page was upgraded (%d)", code)
	}
	refused++
	// A foreign Origin on a raw socket that goes on to send CONNECT as if
	// upgraded: nothing is read as MQTT.
	if code, after := rawUpgrade(t, ws, ws, "http://evil.example"); code != http.StatusForbidden || after {
		t.Errorf("raw upgrade with a foreign Origin: answered %d, CONNACK after it %v; want 403 and none", code, after)
	}
	refused++

	// What must still work.
	for _, c := range []struct {
		name   string
		header http.Header
	}{
		{"no Origin (a non-browser client)", nil},
		{"the listener's own host and port", http.Header{"Origin": {"http://" + ws}}},
		{"localhost on the listener's port", http.Header{"Origin": {"http://localhost:" + port}, "Host": {"localhost:" + port}}},
		{"listed in allowed_origins", http.Header{"Origin": {"https://dashboard.example.com"}}},
		{"listed, written with its default port", http.Header{"Origin": {"https://DASHBOARD.example.com:443"}}},
	} {
		if code := wsDial(t, ws, c.header); code != http.StatusSwitchingProtocols {
			t.Errorf("%s: upgrade answered %d, want 101 and a CONNACK", c.name, code)
		}
	}

	var got float64
	testkit.WaitFor(t, ioTimeout, "the refused upgrades counted in /metrics", func() bool {
		got = g.metric("fieldgate_broker_websocket_origin_refused_total")
		return got == float64(refused)
	})
	g.awaitLog("refused a WebSocket upgrade from a web page of another origin")
	rec.Add("cross-origin upgrades tried", "%d (4 foreign origins incl. null, 1 DNS rebinding, 1 raw)", refused)
	rec.Add("refused with 403 and counted", "%.0f", got)
	rec.Add("still accepted", "no Origin, own host:port, localhost, allowed_origins")
}

// wsDial opens the ws listener at addr with a real WebSocket client
// sending header and returns the HTTP status of the handshake; after a
// 101 it also checks that MQTT flows (CONNECT, CONNACK).
func wsDial(t *testing.T, addr string, header http.Header) int {
	t.Helper()
	d := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: ioTimeout}
	if h := header.Get("Host"); h != "" {
		// The client dials addr but names another host, as a browser
		// does for a name that resolves to addr.
		d.NetDial = func(string, string) (net.Conn, error) { return net.DialTimeout("tcp", addr, ioTimeout) }
		addr = h
		header = header.Clone()
		header.Del("Host")
	}
	c, resp, err := d.Dial("ws://"+addr+"/mqtt", header)
	if err != nil {
		if resp != nil {
			return resp.StatusCode
		}
		t.Fatalf("websocket dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(ioTimeout))
	_ = c.SetReadDeadline(time.Now().Add(ioTimeout))
	if err := c.WriteMessage(websocket.BinaryMessage, mqttConnect); err != nil {
		t.Errorf("writing CONNECT over the WebSocket: %v", err)
		return resp.StatusCode
	}
	_, msg, err := c.ReadMessage()
	if err != nil || len(msg) != 4 || msg[0] != 0x20 || msg[3] != 0 {
		t.Errorf("CONNACK over the WebSocket: % x, %v", msg, err)
	}
	return resp.StatusCode
}

// rawUpgrade sends a WebSocket upgrade by hand to addr, naming host and
// origin, then an MQTT CONNECT as the next bytes; it returns the HTTP
// status and whether a CONNACK came back after it.
func rawUpgrade(t *testing.T, addr, host, origin string) (int, bool) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(ioTimeout))
	fmt.Fprintf(nc, "GET /mqtt HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n"+
		"Origin: %s\r\n\r\n", host, origin)
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to the upgrade: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
	}
	// A masked binary frame holding CONNECT, as a client would send once
	// upgraded.
	frame := []byte{0x82, 0x80 | byte(len(mqttConnect)), 0, 0, 0, 0}
	_, _ = nc.Write(append(frame, mqttConnect...))
	b := make([]byte, 6)
	n, _ := br.Read(b)
	return resp.StatusCode, n >= 4 && b[0] == 0x82 && b[2] == 0x20
}
