package ops

import (
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestSwitchFollowsACL checks that an MQTT user switches only the outputs
// MaySwitch gives it, while the token is not a user and is not asked.
func TestSwitchFollowsACL(t *testing.T) {
	f := newFakeGateway()
	src := f.sources()
	src.Token = testToken
	src.CheckPassword = func(_, user, password string) bool { return password == user+"-pw" }
	src.MaySwitch = func(user, output string) bool { return user == "alice" || output == "fan" }
	s, base := startServer(t, "", src)
	for _, c := range []struct {
		user, output string
		want         int
	}{
		{"alice", "pump", 200},
		{"bob", "pump", 403},
		{"bob", "fan", 200},
		{"", "pump", 200}, // the token
	} {
		req := switchRequest(t, base, c.output, url.Values{"state": {"on"}})
		if c.user != "" {
			req.SetBasicAuth(c.user, c.user+"-pw")
		} else {
			req.Header.Set("Authorization", "Bearer "+testToken)
		}
		resp, body := do(t, req)
		if resp.StatusCode != c.want {
			t.Errorf("%q switching %s = %d (%s), want %d", c.user, c.output, resp.StatusCode, body, c.want)
		}
		if resp.StatusCode == 403 && !strings.Contains(body, "broker.acl") {
			t.Errorf("the refusal %q does not name broker.acl", body)
		}
	}
	if n := len(f.setCalls()); n != 3 {
		t.Errorf("%d outputs switched, want 3", n)
	}
	if got := s.refused.acl.Load(); got != 1 {
		t.Errorf("%d switches counted as refused by the ACL, want 1", got)
	}
}

// TestStatusPageLogin checks that the status page asks for a login on a
// listener that is not loopback, takes the token or an MQTT user's, and
// is refused outright when neither is configured; on loopback it stays
// open, and the probes and /metrics stay open everywhere.
func TestStatusPageLogin(t *testing.T) {
	type step struct {
		path        string
		user, pass  string
		want        int
		wantInBody  string
		description string
	}
	tests := []struct {
		name  string
		addr  string
		edit  func(*Sources)
		steps []step
	}{
		{"not loopback, password file and token", "0.0.0.0:0", func(s *Sources) { s.Token, s.CheckPassword = testToken, checkAlice }, []step{
			{"/", "", "", 401, "needs", "no login"},
			{"/", "alice", "guess", 401, "", "a wrong password"},
			{"/", "alice", "s3cret", 200, "greenhouse-1", "an MQTT user"},
			{"/", "ops", testToken, 200, "greenhouse-1", "the token as the password"},
			{"/healthz", "", "", 200, "ok", "the probe"},
			{"/readyz", "", "", 200, "ready", "the readiness probe"},
			{"/metrics", "", "", 200, "fieldgate_ops_refused_total", "the metrics"},
		}},
		{"not loopback, nothing to log in with", "0.0.0.0:0", nil, []step{
			{"/", "", "", 403, "ops.token", "no login possible"},
			{"/healthz", "", "", 200, "ok", "the probe"},
		}},
		{"loopback", "127.0.0.1:0", nil, []step{
			{"/", "", "", 200, "greenhouse-1", "no login on loopback"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newFakeGateway().sources()
			if tt.edit != nil {
				tt.edit(&src)
			}
			s, _ := startServer(t, tt.addr, src)
			// A wildcard listener is reached through 127.0.0.1 as well.
			_, port, _ := net.SplitHostPort(s.Addr().String())
			base := "http://127.0.0.1:" + port
			for _, st := range tt.steps {
				req, _ := http.NewRequest(http.MethodGet, base+st.path, nil)
				if st.user != "" {
					req.SetBasicAuth(st.user, st.pass)
				}
				resp, body := do(t, req)
				if resp.StatusCode != st.want || !strings.Contains(body, st.wantInBody) {
					t.Errorf("%s: GET %s = %d %.80q, want %d with %q", st.description, st.path, resp.StatusCode, body, st.want, st.wantInBody)
				}
				if resp.StatusCode == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
					t.Errorf("%s: 401 without a Basic challenge", st.description)
				}
			}
			if tt.edit != nil && s.refused.login.Load() != 1 {
				t.Errorf("%d refused logins counted, want 1", s.refused.login.Load())
			}
		})
	}
}
