package ops

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// deadRequest builds a POST of form to a bridge's dead-letter action.
func deadRequest(t *testing.T, base, bridge, action string, form url.Values) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/bridges/"+url.PathEscape(bridge)+"/dead-letters/"+action, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return req
}

// listDead fetches a bridge's dead letters with the token tok ("" for
// none) and decodes them when the answer is 200.
func listDead(t *testing.T, base, bridge, query, tok string) (int, []DeadLetter, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/bridges/"+url.PathEscape(bridge)+"/dead-letters"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, body := do(t, req)
	var list []DeadLetter
	if resp.StatusCode == 200 {
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatalf("the list does not decode: %v\n%s", err, body)
		}
	}
	return resp.StatusCode, list, body
}

// TestDeadLettersOnLoopback: with no credentials configured, a loopback
// listener lists, retries and drops at a loopback host; bad input gets a
// clear answer naming what was wrong.
func TestDeadLettersOnLoopback(t *testing.T) {
	f := newFakeGateway()
	_, base := startServer(t, "", f.sources())

	code, list, body := listDead(t, base, "cloud", "", "")
	if code != 200 || len(list) != 4 || list[1].Topic != "sites/gw1/bad topic" || list[1].Failures != 3 || string(list[1].Payload) != "21.5" || !list[1].At.Equal(epoch.Add(-2*60*60e9)) {
		t.Fatalf("list = %d %+v\n%s", code, list, body)
	}
	if code, list, _ := listDead(t, base, "cloud", "?limit=2", ""); code != 200 || len(list) != 2 || list[0].Seq != 7 {
		t.Errorf("the newest 2 = %d %+v", code, list)
	}
	if code, list, body := listDead(t, base, "backup", "", ""); code != 200 || list == nil || len(list) != 0 {
		t.Errorf("a bridge without dead letters = %d %q, want 200 and []", code, body)
	}
	for _, tc := range []struct {
		query, says string
		code        int
	}{
		{"?limit=x", `limit "x"`, 400},
		{"?limit=0", `limit "0"`, 400},
	} {
		if code, _, body := listDead(t, base, "cloud", tc.query, ""); code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("list %s = %d %q, want %d saying %s", tc.query, code, body, tc.code, tc.says)
		}
	}
	if code, _, body := listDead(t, base, "nowhere", "", ""); code != 404 || !strings.Contains(body, `"nowhere"`) || !strings.Contains(body, "cloud, backup") {
		t.Errorf("list of an unknown bridge = %d %q", code, body)
	}

	for _, tc := range []struct {
		name         string
		bridge, verb string
		form         url.Values
		code         int
		says         string
	}{
		{"unknown bridge", "nowhere", "retry", url.Values{"all": {"true"}}, 404, `no bridge is named "nowhere"`},
		{"unknown seq", "cloud", "retry", url.Values{"seq": {"3,99"}}, 404, "no dead letter 99"},
		{"no seq", "cloud", "drop", url.Values{}, 400, "seq=N"},
		{"bad seq", "cloud", "drop", url.Values{"seq": {"three"}}, 400, `seq "three"`},
		{"seq zero", "cloud", "drop", url.Values{"seq": {"0"}}, 400, `seq "0"`},
		{"seq and all", "cloud", "drop", url.Values{"seq": {"3"}, "all": {"true"}}, 400, "not both"},
		{"all not true", "cloud", "drop", url.Values{"all": {"yes"}}, 400, `not "yes"`},
	} {
		resp, body := do(t, deadRequest(t, base, tc.bridge, tc.verb, tc.form))
		if resp.StatusCode != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %s", tc.name, resp.StatusCode, body, tc.code, tc.says)
		}
	}
	if _, list, _ := listDead(t, base, "cloud", "", ""); len(list) != 4 {
		t.Fatalf("bad requests changed the dead letters: %d left", len(list))
	}

	resp, body := do(t, deadRequest(t, base, "cloud", "retry", url.Values{"seq": {"3", "7"}}))
	if resp.StatusCode != 200 || body != "retried 2 dead letters of bridge cloud\n" {
		t.Errorf("retry 3 and 7 = %d %q", resp.StatusCode, body)
	}
	resp, body = do(t, deadRequest(t, base, "cloud", "drop", url.Values{"all": {"true"}}))
	if resp.StatusCode != 200 || body != "dropped 2 dead letters of bridge cloud\n" {
		t.Errorf("drop all = %d %q", resp.StatusCode, body)
	}
	// What the bridge refuses is a conflict, in its words.
	f.deadErr = errors.New("bridge cloud: the outbox is full")
	resp, body = do(t, deadRequest(t, base, "cloud", "retry", url.Values{"all": {"true"}}))
	if resp.StatusCode != 409 || !strings.Contains(body, "the outbox is full") {
		t.Errorf("a refused retry = %d %q", resp.StatusCode, body)
	}
	// A loopback listener reached under another host name is refused.
	req := deadRequest(t, base, "cloud", "drop", url.Values{"all": {"true"}})
	req.Host = "gateway.example"
	if resp, body := do(t, req); resp.StatusCode != 403 || !strings.Contains(body, "loopback host") {
		t.Errorf("drop at a foreign host = %d %q", resp.StatusCode, body)
	}
	// And a browser's cross-site form is turned away before any of it.
	req = deadRequest(t, base, "cloud", "drop", url.Values{"all": {"true"}})
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if resp, _ := do(t, req); resp.StatusCode != 403 {
		t.Errorf("a cross-site drop = %d, want 403", resp.StatusCode)
	}
}

// TestDeadLettersNeedTheToken: with a token, it is what the dead letters
// need; an MQTT user's login is refused, and so is everything when only a
// password file is configured, saying what to set.
func TestDeadLettersNeedTheToken(t *testing.T) {
	const tok = "0123456789abcdef-ops"
	f := newFakeGateway()
	src := f.sources()
	src.Token, src.CheckPassword = tok, checkAlice
	s, _ := startServer(t, "0.0.0.0:0", src)
	_, port, _ := net.SplitHostPort(s.Addr().String())
	base := "http://127.0.0.1:" + port

	if code, _, body := listDead(t, base, "cloud", "", ""); code != 401 || !strings.Contains(body, "ops token") {
		t.Errorf("list without credentials = %d %q", code, body)
	}
	if code, _, _ := listDead(t, base, "cloud", "", "wrong-token-wrong-token"); code != 401 {
		t.Errorf("list with a wrong token = %d", code)
	}
	req := deadRequest(t, base, "cloud", "drop", url.Values{"all": {"true"}})
	req.SetBasicAuth("alice", "s3cret")
	if resp, body := do(t, req); resp.StatusCode != 401 || !strings.Contains(body, "MQTT user's login is not enough") {
		t.Errorf("drop as an MQTT user = %d %q", resp.StatusCode, body)
	}
	if code, list, _ := listDead(t, base, "cloud", "", tok); code != 200 || len(list) != 4 {
		t.Errorf("list with the token = %d, %d dead letters", code, len(list))
	}
	req = deadRequest(t, base, "cloud", "drop", url.Values{"seq": {"2"}})
	req.Header.Set("Authorization", "Bearer "+tok)
	if resp, body := do(t, req); resp.StatusCode != 200 || !strings.Contains(body, "dropped 1") {
		t.Errorf("drop with the token = %d %q", resp.StatusCode, body)
	}
	if n := s.refused.login.Load(); n < 1 {
		t.Errorf("wrong credentials counted %d times", n)
	}

	// A password file alone gives no operator, even on loopback.
	src.Token = ""
	_, base = startServer(t, "", src)
	if code, _, body := listDead(t, base, "cloud", "", ""); code != 403 || !strings.Contains(body, "set ops.token") {
		t.Errorf("list with only a password file = %d %q", code, body)
	}
}

// TestDeadLettersOff: a gateway without dead letters answers 501.
func TestDeadLettersOff(t *testing.T) {
	src := newFakeGateway().sources()
	src.DeadLetters, src.RetryDeadLetters, src.DropDeadLetters = nil, nil, nil
	_, base := startServer(t, "", src)
	if code, _, _ := listDead(t, base, "cloud", "", ""); code != 501 {
		t.Errorf("list = %d, want 501", code)
	}
	if resp, _ := do(t, deadRequest(t, base, "cloud", "retry", url.Values{"all": {"true"}})); resp.StatusCode != 501 {
		t.Errorf("retry = %d, want 501", resp.StatusCode)
	}
}
