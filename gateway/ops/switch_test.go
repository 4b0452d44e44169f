package ops

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const testToken = "0123456789abcdef-token"

// checkAlice accepts alice with the password s3cret.
func checkAlice(_, user, password string) bool { return user == "alice" && password == "s3cret" }

// switchRequest builds POST /outputs/{name} with a form.
func switchRequest(t *testing.T, base, name string, form url.Values) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/outputs/"+url.PathEscape(name), strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return req
}

func TestSwitchWithCredentials(t *testing.T) {
	on := url.Values{"state": {"on"}}
	withToken := func(tok string) url.Values { return url.Values{"state": {"on"}, "token": {tok}} }
	tests := []struct {
		name     string
		output   string
		form     url.Values
		prepare  func(*http.Request)
		want     int
		wantCall bool
		wantText string // in the body
	}{
		{name: "no credentials", output: "pump", form: on, want: 401, wantText: "ops token"},
		{name: "basic auth", output: "pump", form: on, prepare: func(r *http.Request) { r.SetBasicAuth("alice", "s3cret") }, want: 200, wantCall: true, wantText: "pump on"},
		{name: "basic auth, wrong password", output: "pump", form: on, prepare: func(r *http.Request) { r.SetBasicAuth("alice", "guess") }, want: 401},
		{name: "basic auth, unknown user", output: "pump", form: on, prepare: func(r *http.Request) { r.SetBasicAuth("mallory", "s3cret") }, want: 401},
		{name: "token field", output: "pump", form: withToken(testToken), want: 200, wantCall: true},
		{name: "token field, wrong", output: "pump", form: withToken(testToken + "x"), want: 401},
		{name: "token field, prefix", output: "pump", form: withToken(testToken[:10]), want: 401},
		{name: "bearer", output: "pump", form: on, prepare: func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+testToken) }, want: 200, wantCall: true},
		{name: "bearer, wrong", output: "pump", form: on, prepare: func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, want: 401},
		{name: "wrong token, right login", output: "pump", form: withToken("nope"), prepare: func(r *http.Request) { r.SetBasicAuth("alice", "s3cret") }, want: 200, wantCall: true},
		{name: "token in the URL is not taken", output: "pump", form: on, prepare: func(r *http.Request) { r.URL.RawQuery = "token=" + testToken }, want: 401},
		{name: "bad state", output: "pump", form: url.Values{"state": {"maybe"}}, prepare: func(r *http.Request) { r.SetBasicAuth("alice", "s3cret") }, want: 400},
		{name: "unknown output", output: "heater", form: on, prepare: func(r *http.Request) { r.SetBasicAuth("alice", "s3cret") }, want: 404, wantText: "heater"},
		{name: "unknown output, no credentials", output: "heater", form: on, want: 401},
		{name: "cross-site post", output: "pump", form: on, prepare: func(r *http.Request) {
			r.SetBasicAuth("alice", "s3cret")
			r.Header.Set("Sec-Fetch-Site", "cross-site")
		}, want: 403},
		{name: "foreign origin", output: "pump", form: on, prepare: func(r *http.Request) {
			r.SetBasicAuth("alice", "s3cret")
			r.Header.Set("Origin", "http://evil.example")
		}, want: 403},
		{name: "same-origin browser", output: "pump", form: on, prepare: func(r *http.Request) {
			r.SetBasicAuth("alice", "s3cret")
			r.Header.Set("Sec-Fetch-Site", "same-origin")
			r.Header.Set("Accept", "text/html,application/xhtml+xml")
		}, want: 303, wantCall: true},
		{name: "oversized form", output: "pump", form: url.Values{"state": {"on"}, "pad": {strings.Repeat("x", 2*maxFormBytes)}}, prepare: func(r *http.Request) { r.SetBasicAuth("alice", "s3cret") }, want: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGateway()
			src := f.sources()
			src.Token, src.CheckPassword = testToken, checkAlice
			_, base := startServer(t, "", src)
			req := switchRequest(t, base, tt.output, tt.form)
			if tt.prepare != nil {
				tt.prepare(req)
			}
			resp, body := do(t, req)
			if resp.StatusCode != tt.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.want, body)
			}
			if !strings.Contains(body, tt.wantText) {
				t.Errorf("body %q does not mention %q", body, tt.wantText)
			}
			calls := f.setCalls()
			switch {
			case tt.wantCall && (len(calls) != 1 || calls[0] != setCall{"pump", true}):
				t.Errorf("SetOutput calls %v, want pump on", calls)
			case !tt.wantCall && len(calls) != 0:
				t.Errorf("SetOutput called %v on a refused request", calls)
			}
			if resp.StatusCode == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("401 without a Basic challenge: %q", resp.Header.Get("WWW-Authenticate"))
			}
			if resp.StatusCode == 303 && resp.Header.Get("Location") != "/" {
				t.Errorf("redirect to %q, want /", resp.Header.Get("Location"))
			}
		})
	}
}

func TestSwitchTokenOnly(t *testing.T) {
	f := newFakeGateway()
	src := f.sources()
	src.Token = testToken
	_, base := startServer(t, "", src)
	req := switchRequest(t, base, "fan", url.Values{"state": {"off"}})
	req.SetBasicAuth("alice", "s3cret") // no password file: not a way in
	resp, body := do(t, req)
	if ch := resp.Header.Values("WWW-Authenticate"); resp.StatusCode != 401 || len(ch) != 2 || !strings.HasPrefix(ch[0], "Basic") || !strings.HasPrefix(ch[1], "Bearer") {
		t.Fatalf("basic auth without a password file = %d %q (%s), want 401 with a Basic and a Bearer challenge", resp.StatusCode, ch, body)
	}
	// A browser sends the token as the password of basic auth.
	req = switchRequest(t, base, "fan", url.Values{"state": {"on"}})
	req.SetBasicAuth("anyone", testToken)
	if resp, body := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("the token as a basic auth password = %d: %s", resp.StatusCode, body)
	}
	req = switchRequest(t, base, "fan", url.Values{"state": {"off"}})
	req.Header.Set("Authorization", "bearer "+testToken)
	if resp, body := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("bearer token = %d: %s", resp.StatusCode, body)
	}
	if calls := f.setCalls(); len(calls) != 2 || calls[1] != (setCall{"fan", false}) {
		t.Errorf("SetOutput calls %v, want fan on, then off", calls)
	}
}

func TestSwitchWithoutCredentialsOnLoopback(t *testing.T) {
	f := newFakeGateway()
	_, base := startServer(t, "127.0.0.1:0", f.sources())
	resp, body := do(t, switchRequest(t, base, "pump", url.Values{"state": {"on"}}))
	if resp.StatusCode != 200 {
		t.Fatalf("switch on a loopback listener without credentials = %d: %s", resp.StatusCode, body)
	}
	// A name an attacker's DNS points at 127.0.0.1 is same-origin to the
	// browser; the Host check turns it away.
	req := switchRequest(t, base, "pump", url.Values{"state": {"off"}})
	req.Host = "rebind.example:9100"
	if resp, body := do(t, req); resp.StatusCode != 403 || !strings.Contains(body, "loopback host") {
		t.Fatalf("switch with Host rebind.example = %d %q, want 403", resp.StatusCode, body)
	}
	req = switchRequest(t, base, "pump", url.Values{"state": {"off"}})
	req.Host = "localhost:9100"
	if resp, body := do(t, req); resp.StatusCode != 200 {
		t.Fatalf("switch with Host localhost = %d %q, want 200", resp.StatusCode, body)
	}
	if calls := f.setCalls(); len(calls) != 2 {
		t.Errorf("SetOutput calls %v, want pump on, pump off", calls)
	}
}

func TestSwitchWithoutCredentialsElsewhere(t *testing.T) {
	f := newFakeGateway()
	// The wildcard address is not loopback; the test still reaches it
	// through 127.0.0.1.
	s, _ := startServer(t, "0.0.0.0:0", f.sources())
	_, port, _ := net.SplitHostPort(s.Addr().String())
	base := "http://127.0.0.1:" + port
	resp, body := do(t, switchRequest(t, base, "pump", url.Values{"state": {"on"}}))
	if resp.StatusCode != 403 {
		t.Fatalf("switch without credentials on a wildcard listener = %d, want 403: %s", resp.StatusCode, body)
	}
	for _, want := range []string{"ops.token", "broker.password_file", "loopback"} {
		if !strings.Contains(body, want) {
			t.Errorf("the refusal %q does not mention %s", body, want)
		}
	}
	if calls := f.setCalls(); len(calls) != 0 {
		t.Errorf("SetOutput called: %v", calls)
	}
	// The page, which names clients, is refused too, saying why.
	if resp, page := get(t, base+"/"); resp.StatusCode != 403 || !strings.Contains(page, "set ops.token") {
		t.Errorf("the status page without credentials on a wildcard listener = %d %q, want 403 with the reason", resp.StatusCode, page)
	}
}

func TestSwitchFailure(t *testing.T) {
	f := newFakeGateway()
	f.setErr = errors.New("gpio: pin GPIO17 busy")
	_, base := startServer(t, "", f.sources())
	resp, body := do(t, switchRequest(t, base, "pump", url.Values{"state": {"on"}}))
	if resp.StatusCode != 500 || !strings.Contains(body, "GPIO17 busy") {
		t.Fatalf("a failing SetOutput = %d %q, want 500 with the error", resp.StatusCode, body)
	}
}

func TestPasswordChecksAreBounded(t *testing.T) {
	f := newFakeGateway()
	src := f.sources()
	var now, peak atomic.Int32
	src.CheckPassword = func(remote, user, password string) bool {
		// The check is told where the request came from, so that the
		// failures of that address count.
		if host, _, err := net.SplitHostPort(remote); err != nil || host != "127.0.0.1" {
			t.Errorf("CheckPassword was given remote %q, want 127.0.0.1:port", remote)
		}
		n := now.Add(1)
		defer now.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(50 * time.Millisecond) // a bcrypt hash on a slow core
		return false
	}
	_, base := startServer(t, "", src)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			req := switchRequest(t, base, "pump", url.Values{"state": {"on"}})
			req.SetBasicAuth("guess", "guess")
			if resp, _ := do(t, req); resp.StatusCode != 401 {
				t.Errorf("wrong login = %d, want 401", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > int32(cap(New("", Sources{}, nil).auth)) || p < 1 {
		t.Errorf("%d password checks ran at once, want at most %d", p, cap(New("", Sources{}, nil).auth))
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1:9100": true, "127.0.0.1": true, "localhost:9100": true, "LOCALHOST": true,
		"[::1]:9100": true, "127.1.2.3:80": true,
		"gateway.local:9100": false, "192.168.1.2:9100": false, "localhost.evil.example": false, "": false,
	} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
