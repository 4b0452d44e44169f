package ops

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// FuzzRequest serves arbitrary HTTP requests from the network, parsed as
// net/http's server parses them, on the endpoint in each of its switch
// modes (the first byte picks one: token and password file, token only,
// loopback without credentials, no credentials elsewhere). Nothing may
// panic, and an output may be switched only by a request that carried
// the token or alice's login (or, on loopback without credentials, named
// a loopback host), that a browser did not mark as cross-site, and never
// when switching is refused.
//
//	go test -run '^$' -fuzz FuzzRequest -fuzztime 15s ./gateway/ops
func FuzzRequest(f *testing.F) {
	post := func(target, host, form string, headers ...string) []byte {
		var b strings.Builder
		b.WriteString("POST " + target + " HTTP/1.1\r\nHost: " + host + "\r\n")
		b.WriteString("Content-Type: application/x-www-form-urlencoded\r\n")
		for _, h := range headers {
			b.WriteString(h + "\r\n")
		}
		b.WriteString("Content-Length: " + strconv.Itoa(len(form)) + "\r\n\r\n" + form)
		return []byte(b.String())
	}
	alice := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	for mode := range byte(4) {
		for _, req := range [][]byte{
			post("/outputs/pump", "gw.local", "state=on&token="+testToken),
			post("/outputs/pump", "gw.local", "state=off", alice),
			post("/outputs/pump", "gw.local", "state=on", "Authorization: Bearer "+testToken),
			post("/outputs/pump", "gw.local", "state=on", alice, "Sec-Fetch-Site: cross-site"),
			post("/outputs/pump", "gw.local", "state=on", alice, "Origin: https://evil.example"),
			post("/outputs/pump", "127.0.0.1:9100", "state=on"),
			post("/outputs/pump", "localhost", "state=off"),
			post("/outputs/pump", "[::1]:9100", "state=on"),
			post("/outputs/pump", "127.0.0.1.evil.example", "state=on"),
			post("/outputs/fan%2Fx", "127.0.0.1", "state=on"),
			post("/outputs/pump?token="+testToken, "gw.local", "state=on"),
			post("/outputs/pump", "gw.local", "state=on&token=%30123456789abcdef-token"),
			[]byte("POST /outputs/pump HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nstat\r\n4\r\ne=on\r\n0\r\n\r\n"),
			[]byte("GET / HTTP/1.1\r\nHost: gw.local\r\n\r\n"),
			[]byte("GET /metrics HTTP/1.1\r\nHost: gw.local\r\n\r\n"),
			[]byte("GET /readyz HTTP/1.0\r\n\r\n"),
			[]byte("GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n"),
		} {
			f.Add(append([]byte{mode}, req...))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		mode := data[0] % 4
		r, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data[1:])))
		if err != nil {
			return // the server answers 400 before any handler
		}
		r.RemoteAddr = "192.0.2.7:40000"
		gw := newFakeGateway()
		src := gw.sources()
		s := New("127.0.0.1:0", src, nil)
		switch mode {
		case 0:
			s.src.Token, s.src.CheckPassword = testToken, checkAlice
		case 1:
			s.src.Token = testToken
		case 2:
			s.loopback = true
		}
		w := httptest.NewRecorder()
		s.handler().ServeHTTP(w, r)
		calls := gw.setCalls()
		if len(calls) == 0 {
			return
		}
		if w.Code != http.StatusOK && w.Code != http.StatusSeeOther {
			t.Fatalf("switched %v, yet answered %d", calls, w.Code)
		}
		// The credentials the request carried, read a second time from
		// its bytes: headers, and the body with any chunking undone.
		again, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data[1:])))
		if err != nil {
			t.Fatalf("a request that parsed once does not parse again: %v", err)
		}
		body, _ := io.ReadAll(again.Body)
		if site := again.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
			t.Fatalf("switched %v on a request the browser marked %q", calls, site)
		}
		carried := fuzzUnescape(string(body)) + "\n" + fuzzHeaderText(again.Header)
		switch mode {
		case 0, 1:
			login := mode == 0 && strings.Contains(carried, base64.StdEncoding.EncodeToString([]byte("alice:s3cret")))
			if !strings.Contains(carried, testToken) && !login {
				t.Fatalf("mode %d: switched %v without the token or a login:\n%q", mode, calls, data[1:])
			}
		case 2:
			if !loopbackHost(again.Host) {
				t.Fatalf("switched %v on loopback for host %q", calls, again.Host)
			}
		default:
			t.Fatalf("switched %v with switching refused", calls)
		}
	})
}

// fuzzUnescape decodes %XX escapes and '+' as a form does, leaving a bad
// escape as it is.
func fuzzUnescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := url.PathUnescape(s[i : i+3]); err == nil {
				b.WriteString(v)
				i += 2
				continue
			}
		}
		if s[i] == '+' {
			b.WriteByte(' ')
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fuzzHeaderText is every header line, as the request sent them.
func fuzzHeaderText(h http.Header) string {
	var b strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\n")
		}
	}
	return b.String()
}
