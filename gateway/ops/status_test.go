package ops

import (
	"crypto/sha256"
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestStatusPage(t *testing.T) {
	f := newFakeGateway()
	s, base := startServer(t, "", f.sources())
	s.sample(epoch.Add(-sampleEvery))
	s.sample(epoch)
	resp, page := get(t, base+"/")
	if resp.StatusCode != 200 {
		t.Fatalf("/ = %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type = %q", ct)
	}
	for _, want := range []string{
		`<meta name="viewport" content="width=device-width, initial-scale=1">`,
		`<meta http-equiv="refresh" content="10">`,
		`<h1 id="device">greenhouse-1</h1>`,
		`<span id="version">1.2.3</span>`,
		`<span id="uptime">3h 25m</span>`,
		`id="ready" class="badge ok">ready`,
		// sensors: values, units, ages, state
		`data-sensor="bench"`,
		`data-quantity="temperature"`,
		`<span class="value">21.5</span> <span class="unit">°C</span>`,
		`<span class="value">48.25</span> <span class="unit">%</span>`,
		`<span class="value">1013.2</span> <span class="unit">hPa</span>`,
		`read <span class="age">5s</span> ago`,
		`<span class="badge bad state">failing</span>`,
		`i2c: no ACK from 0x48`,
		`read <span class="age">11m 0s</span> ago`,
		// outputs: a switch per relay, posting the opposite state
		`action="/outputs/pump"`,
		`<input type="hidden" name="state" value="on">`,
		`aria-checked="false"`,
		`action="/outputs/fan"`,
		`<input type="hidden" name="state" value="off">`,
		// bridges
		`data-bridge="cloud"`,
		`<span class="badge ok state">connected</span>`,
		`<span class="depth">12</span> messages, 3.4 KiB, oldest 1m 30s old`,
		`<span class="badge bad state">down</span>`,
		`connection refused`,
		// what the backup's link learned and is going through; the cloud's healthy link has no such line
		`<dd class="link">MQTT 3.1.1, QoS 1 at most, 6 attempts in a row delivered nothing</dd>`,
		// dead letters: the count, and the newest few with topic, reason and age, escaped
		`<span class="dead">4</span> dead letters, 900 B`,
		`<li data-seq="8"><span class="topic">sites/gw1/x</span> <span class="dim">30s ago</span>`,
		`<span class="topic">sites/gw1/&lt;b&gt;</span> <span class="dim">1m 30s ago</span><br><span class="err">0x99 payload format invalid</span>`,
		`<li data-seq="3"><span class="topic">sites/gw1/bad topic</span>`,
		`retry or drop them with fieldgate db deadletters`,
		// clients
		`<td>plc-1</td><td>plc</td><td>default</td><td>192.168.1.20:50000</td><td>5</td>`,
		`<td>dash</td><td></td><td>ws</td><td>10.0.0.5:4444</td><td>3.1.1</td>`,
		// broker and storage summary
		`3 connected`, `state file 1.0 MiB`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the status page lacks %s", want)
		}
	}
	// Only the newest three dead letters, newest first.
	if strings.Contains(page, `data-seq="2"`) || strings.Index(page, `data-seq="8"`) > strings.Index(page, `data-seq="3"`) {
		t.Error("the status page shows more than the newest three dead letters, or not newest first")
	}
	// The sparklines: the two samples give each good quantity one line.
	if n := strings.Count(page, `class="link"`); n != 1 {
		t.Errorf("the status page has %d link lines, want 1: the healthy MQTT 5 bridge needs none", n)
	}
	if n := strings.Count(page, "<polyline "); n != 3 {
		t.Errorf("the page has %d sparklines, want 3 (bench's quantities; tank is failing)", n)
	}
	if t.Failed() {
		t.Logf("page:\n%s", page)
	}
}

func TestStatusPageIsSelfContained(t *testing.T) {
	_, base := startServer(t, "", newFakeGateway().sources())
	resp, page := get(t, base+"/")
	// Nothing is loaded from anywhere: no scripts, stylesheets, images or
	// fonts by URL, and nothing from another host.
	for _, bad := range []string{"<script", "<link rel=\"stylesheet\"", "<img", "@import", "url(", "http://", "https://", "//"} {
		if strings.Contains(page, bad) {
			t.Errorf("the status page contains %q", bad)
		}
	}
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "form-action 'self'") {
		t.Errorf("Content-Security-Policy = %q, want default-src 'none' and form-action 'self'", csp)
	}
	// The policy allows the inline stylesheet by its hash; a browser would
	// drop the styles if the two differed.
	m := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no <style> element")
	}
	sum := sha256.Sum256([]byte(m[1]))
	if want := "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"; !strings.Contains(csp, want) {
		t.Errorf("Content-Security-Policy %q does not allow the page's stylesheet (%s)", csp, want)
	}
	if !strings.Contains(m[1], "@media (min-width:600px)") {
		t.Error("the stylesheet has no breakpoint at 600px")
	}
}

func TestStatusPageEscapes(t *testing.T) {
	f := newFakeGateway()
	f.sensors[0].Name = `<script>alert(1)</script>`
	f.sensors[1].LastError = `"><img src=x>`
	f.outputs[0].Name = `a b/c?d`
	_, base := startServer(t, "", f.sources())
	_, page := get(t, base+"/?refresh=off")
	for _, bad := range []string{"<script>", "<img src=x>"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page carries %s unescaped", bad)
		}
	}
	if !strings.Contains(page, `action="/outputs/a%20b%2Fc%3Fd"`) {
		t.Errorf("an output's name is not escaped as one path segment in its form action")
	}
	if strings.Contains(page, `http-equiv="refresh"`) || !strings.Contains(page, "refresh paused") {
		t.Error("?refresh=off does not pause the refresh")
	}
}

func TestStatusPageNotReady(t *testing.T) {
	f := newFakeGateway()
	f.ready, f.why = false, "listener default not bound"
	_, base := startServer(t, "", f.sources())
	_, page := get(t, base+"/")
	if !strings.Contains(page, "not ready: listener default not bound") {
		t.Error("the page does not say why the gateway is not ready")
	}
}

func TestFormatters(t *testing.T) {
	ages := map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 59 * time.Second: "59s", 61 * time.Second: "1m 1s",
		3*time.Hour + 25*time.Minute: "3h 25m", 50 * time.Hour: "2d 2h",
	}
	for d, want := range ages {
		if got := formatAge(d); got != want {
			t.Errorf("formatAge(%v) = %q, want %q", d, got, want)
		}
	}
	sizes := map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"}
	for n, want := range sizes {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	values := map[float64]string{21.5: "21.5", 1013.25: "1013.25", 0.1 + 0.2: "0.3", 123456789: "123456789", 0.0000001: "0.0000001", -3: "-3"}
	for v, want := range values {
		if got := formatValue(v); got != want {
			t.Errorf("formatValue(%v) = %q, want %q", v, got, want)
		}
	}
}
