package broker

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestParseOrigin(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{in: "https://dashboard.example.com", want: "https://dashboard.example.com:443"},
		{in: "HTTPS://Dashboard.Example.COM:443", want: "https://dashboard.example.com:443"},
		{in: "http://192.168.1.20:8080", want: "http://192.168.1.20:8080"},
		{in: "http://[::1]:8080", want: "http://[::1]:8080"},
		{in: "http://[fe80::1]", want: "http://[fe80::1]:80"},
		{in: "dashboard.example.com", err: "has no scheme"},
		{in: "ws://dashboard.example.com", err: `has the scheme "ws"`},
		{in: "null", err: "has no scheme"},
		{in: "*", err: "has no scheme"},
		{in: "https://", err: "has no host"},
		{in: "https://dashboard.example.com/", err: "has a path"},
		{in: "https://dashboard.example.com/app", err: "has a path"},
		{in: "https://dashboard.example.com?x=1", err: "has a path, query"},
		{in: "https://u@dashboard.example.com", err: "has a user name"},
		{in: "https://dashboard.example.com:0", err: `has the port "0"`},
		{in: "https://dashboard.example.com:99999", err: "port"},
		{in: "http://a b", err: "is not a URL"},
	} {
		got, err := parseOrigin(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("parseOrigin(%q) = %q, %v; want %q", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("parseOrigin(%q) = %q, %v; want an error with %q", c.in, got, err, c.err)
		}
	}
}

func TestOriginPolicy(t *testing.T) {
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	lan := &net.TCPAddr{IP: net.IPv4(192, 168, 1, 20), Port: 8080}
	for _, c := range []struct {
		name    string
		wss     bool
		local   net.Addr
		host    string
		origins []string // Origin headers sent
		ok      bool
	}{
		{name: "no Origin", local: lan, host: "gw:8080", ok: true},
		{name: "no Origin on loopback, any Host", local: loopback, host: "evil.example:8080", ok: true},
		{name: "own host and port", local: lan, host: "192.168.1.20:8080", origins: []string{"http://192.168.1.20:8080"}, ok: true},
		{name: "own name, case differs", local: lan, host: "GW.lan:8080", origins: []string{"http://gw.LAN:8080"}, ok: true},
		{name: "own host, other port", local: lan, host: "192.168.1.20:8080", origins: []string{"http://192.168.1.20:9000"}},
		{name: "default ports: wss and https", wss: true, local: lan, host: "gw.lan", origins: []string{"https://gw.lan"}, ok: true},
		{name: "default ports: ws and http", local: lan, host: "gw.lan", origins: []string{"http://gw.lan"}, ok: true},
		{name: "wss host without port is 443, not 80", wss: true, local: lan, host: "gw.lan", origins: []string{"http://gw.lan"}},
		{name: "foreign", local: lan, host: "192.168.1.20:8080", origins: []string{"https://evil.example"}},
		{name: "allowed", local: lan, host: "192.168.1.20:8080", origins: []string{"https://dashboard.example.com"}, ok: true},
		{name: "allowed, default port written", local: lan, host: "192.168.1.20:8080", origins: []string{"https://dashboard.example.com:443"}, ok: true},
		{name: "allowed host, other scheme", local: lan, host: "192.168.1.20:8080", origins: []string{"http://dashboard.example.com"}},
		{name: "null", local: loopback, host: "127.0.0.1:8080", origins: []string{"null"}},
		{name: "empty", local: loopback, host: "127.0.0.1:8080", origins: []string{""}},
		{name: "two Origin headers", local: loopback, host: "127.0.0.1:8080", origins: []string{"http://127.0.0.1:8080", "https://dashboard.example.com"}},
		{name: "loopback, own address", local: loopback, host: "127.0.0.1:8080", origins: []string{"http://127.0.0.1:8080"}, ok: true},
		{name: "loopback, localhost", local: loopback, host: "localhost:8080", origins: []string{"http://localhost:8080"}, ok: true},
		{name: "loopback, [::1]", local: &net.TCPAddr{IP: net.IPv6loopback, Port: 8080}, host: "[::1]:8080", origins: []string{"http://[::1]:8080"}, ok: true},
		{name: "loopback, DNS rebinding", local: loopback, host: "evil.example:8080", origins: []string{"http://evil.example:8080"}},
		{name: "LAN, the same name is trusted", local: lan, host: "evil.example:8080", origins: []string{"http://evil.example:8080"}, ok: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			typ := ListenerWS
			if c.wss {
				typ = ListenerWSS
			}
			var refused atomic.Int64
			p, err := newOriginPolicy(Listener{Name: "web", Type: typ, AllowedOrigins: []string{"https://Dashboard.example.com"}}, &refused)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/mqtt", nil)
			r.Host = c.host
			for _, o := range c.origins {
				r.Header.Add("Origin", o)
			}
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, c.local))
			ok, why := p.check(r)
			if ok != c.ok {
				t.Fatalf("check = %v (%s), want %v", ok, why, c.ok)
			}
			if !ok {
				w := httptest.NewRecorder()
				p.refuse(w, r, why)
				if w.Code != http.StatusForbidden || refused.Load() != 1 {
					t.Errorf("refuse: status %d, counted %d; want 403 and 1", w.Code, refused.Load())
				}
			}
		})
	}
}

func TestOriginPolicyRefusesABadList(t *testing.T) {
	_, err := newOriginPolicy(Listener{Name: "web", Type: ListenerWS, AllowedOrigins: []string{"https://ok.example", "example.com"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "allowed_origins[1]") {
		t.Fatalf("newOriginPolicy = %v, want an error naming allowed_origins[1]", err)
	}
}
