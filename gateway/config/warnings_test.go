package config

import (
	"strings"
	"testing"
)

// TestAnonymousNetworkWarning: anonymous access on a listener other hosts
// can reach is valid but warned about, at the listener's address with its
// line and the line of allow_anonymous; on loopback, behind client
// certificates, on a unix socket or with credentials required it is not.
func TestAnonymousNetworkWarning(t *testing.T) {
	type want struct {
		line int
		path string
		msg  string
	}
	for _, c := range []struct {
		name string
		yaml string
		want []want
	}{
		{"every address", "broker:\n  allow_anonymous: true\nlisteners:\n  - name: lan\n    type: tcp\n    address: 0.0.0.0:1883\n",
			[]want{{6, "listeners[0].address", "0.0.0.0:1883 listens on every address of the board, and broker.allow_anonymous (line 2) is on: anyone on the network can connect without credentials"}}},
		{"empty host", "broker: {allow_anonymous: true}\nlisteners:\n  - {name: lan, type: tcp, address: ':1883'}\n",
			[]want{{3, "listeners[0].address", ":1883 listens on every address"}}},
		{"a LAN address, second listener, ws", "broker:\n  allow_anonymous: true\nlisteners:\n  - {name: local, type: tcp, address: '127.0.0.1:1883'}\n  - {name: web, type: ws, address: '192.168.1.20:8080'}\n",
			[]want{{5, "listeners[1].address", "192.168.1.20:8080 is not a loopback address"}}},
		{"tls without client certificates", "broker: {allow_anonymous: true}\nlisteners:\n  - {name: s, type: tls, address: ':8883', tls: {cert: c, key: k}}\n",
			[]want{{3, "listeners[0].address", "set broker.allow_anonymous: false and broker.password_file"}}},
		{"loopback", "broker:\n  allow_anonymous: true\nlisteners:\n  - {name: a, type: tcp, address: '127.0.0.1:1883'}\n  - {name: b, type: ws, address: '[::1]:8080'}\n  - {name: c, type: ws, address: 'localhost:8081'}\n", nil},
		{"not anonymous", "broker:\n  allow_anonymous: false\nlisteners:\n  - {name: lan, type: tcp, address: '0.0.0.0:1883'}\n", nil},
		{"anonymous left at its default", "listeners:\n  - {name: lan, type: tcp, address: '0.0.0.0:1883'}\n", nil},
		{"client certificates required", "broker: {allow_anonymous: true}\nlisteners:\n  - {name: s, type: wss, address: ':8443', tls: {cert: c, key: k, client_ca: ca}}\n", nil},
		{"unix socket", "broker: {allow_anonymous: true}\nlisteners:\n  - {name: u, type: unix, address: /run/fieldgate/mqtt.sock}\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse("site.yaml", []byte(c.yaml))
			if err != nil {
				t.Fatalf("a warning must not make the file invalid: %v", err)
			}
			ws := cfg.Warnings()
			if len(ws) != len(c.want) {
				t.Fatalf("warnings %q, want %d", ws, len(c.want))
			}
			for i, w := range c.want {
				got := ws[i]
				if got.Line != w.line || got.Path != w.path || !strings.Contains(got.Msg, w.msg) || got.File != "site.yaml" {
					t.Errorf("warning %q, want site.yaml:%d: %s: …%s…", got, w.line, w.path, w.msg)
				}
			}
		})
	}
}

// TestEmbeddedConfigHasNoWarnings: the configuration the README's first
// command runs on is loopback-only.
func TestEmbeddedConfigHasNoWarnings(t *testing.T) {
	cfg, err := Parse(EmbeddedName, Embedded())
	if err != nil {
		t.Fatal(err)
	}
	if ws := cfg.Warnings(); len(ws) != 0 {
		t.Errorf("the embedded configuration warns: %q", ws)
	}
}
