package config

import (
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/sensors"
)

// problemsOf returns the problems carried by err, failing the test if err is
// not a *Error.
func problemsOf(t *testing.T, err error) []Problem {
	t.Helper()
	var cerr *Error
	if !errors.As(err, &cerr) {
		t.Fatalf("error %v (%T) is not a *config.Error", err, err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(err, ErrInvalid) = false for %v", err)
	}
	return cerr.Problems
}

func TestEmbeddedDefault(t *testing.T) {
	cfg, err := Parse(EmbeddedName, Embedded())
	if err != nil {
		t.Fatalf("embedded default does not parse: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("embedded default does not validate: %v", err)
	}
	// The embedded config runs on any laptop: loopback only, no hardware.
	addrs := []string{cfg.Ops.Address}
	for _, l := range cfg.Listeners {
		addrs = append(addrs, l.Address)
	}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatalf("address %q: %v", a, err)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			t.Errorf("embedded default binds %q, want a loopback address", a)
		}
	}
	if len(cfg.Sensors) == 0 {
		t.Fatal("embedded default has no sensors, want a simulated one")
	}
	for _, s := range cfg.Sensors {
		if s.Bus != "sim" {
			t.Errorf("sensor %q is on bus %q, want sim (no hardware)", s.Name, s.Bus)
		}
	}
	if got := cfg.Sensors[0].Address; got != "0x76" {
		t.Errorf("sensor address = %q, want the text 0x76 kept as written", got)
	}
}

func TestDefaultValidates(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
}

func TestDecodeKeepsDefaults(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		check func(t *testing.T, c *Config)
	}{
		{"the rest keep defaults", "# one key\nlog: {level: debug}\n", func(t *testing.T, c *Config) {
			if len(c.Listeners) != 1 || c.Listeners[0].Address != "127.0.0.1:1883" {
				t.Errorf("listeners = %+v, want the default listener", c.Listeners)
			}
		}},
		{"one key set", "log:\n  format: json\n", func(t *testing.T, c *Config) {
			if c.Log.Format != "json" || c.Log.Level != "info" {
				t.Errorf("log = %+v, want json format with default level", c.Log)
			}
		}},
		{"null keeps default", "storage:\n  path:\n", func(t *testing.T, c *Config) {
			if c.Storage.Path != Default().Storage.Path {
				t.Errorf("storage.path = %q, want the default", c.Storage.Path)
			}
		}},
		{"list replaces default", "listeners:\n  - {name: lan, type: tcp, address: ':1883'}\n", func(t *testing.T, c *Config) {
			if len(c.Listeners) != 1 || c.Listeners[0].Name != "lan" {
				t.Errorf("listeners = %+v, want only lan", c.Listeners)
			}
		}},
		{"empty list clears", "listeners: []\n", func(t *testing.T, c *Config) {
			if len(c.Listeners) != 0 {
				t.Errorf("listeners = %+v, want none", c.Listeners)
			}
		}},
		{"durations and numbers", "broker:\n  max_keepalive: 90s\n  max_packet_size: 0x10000\n", func(t *testing.T, c *Config) {
			if c.Broker.MaxKeepalive != 90*time.Second || c.Broker.MaxPacketSize != 65536 {
				t.Errorf("broker = %+v", c.Broker)
			}
		}},
		{"anchors and aliases", "sensors:\n  - &s {name: a, kind: bme280, bus: sim, interval: 1s}\n  - {name: b, kind: bme280, bus: sim, interval: 2s}\nbroker: {allow_anonymous: true}\n", func(t *testing.T, c *Config) {
			if len(c.Sensors) != 2 || !c.Broker.AllowAnonymous {
				t.Errorf("config = %+v", c)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("test.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tt.check(t, c)
		})
	}
}

// wantProblem is one problem a broken file must produce.
type wantProblem struct {
	line int
	path string
	msg  string // a substring of the message: what would be right
}

func TestBrokenConfigs(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []wantProblem
	}{
		{"unknown top-level key", "log:\n  level: info\nlogging: {}\n",
			[]wantProblem{{3, "logging", "unknown key"}}},
		{"short unknown key gets no far-fetched suggestion", "foo: 1\n",
			[]wantProblem{{1, "foo", "unknown key; known keys here: log, storage"}}},
		{"swapped letters", "log:\n  levle: info\n",
			[]wantProblem{{2, "log.levle", `did you mean "level"`}}},
		{"unknown nested key with suggestion", "broker:\n  allow_anonymous: true\n  max_keepalve: 60s\n",
			[]wantProblem{{3, "broker.max_keepalve", `did you mean "max_keepalive"`}}},
		{"unknown key in a list item", "listeners:\n  - name: a\n    type: tcp\n    adress: 127.0.0.1:1883\n",
			[]wantProblem{{4, "listeners[0].adress", "unknown key"}, {2, "listeners[0].address", "required: host:port"}}},
		{"bad log level", "log:\n  level: verbose\n",
			[]wantProblem{{2, "log.level", "use one of debug, info, warn, error"}}},
		{"duration without unit", "broker:\n  max_keepalive: 60\n",
			[]wantProblem{{2, "broker.max_keepalive", "add a unit: 60s"}}},
		{"keepalive beyond MQTT", "broker:\n  max_keepalive: 24h\n",
			[]wantProblem{{2, "broker.max_keepalive", "from 1s to 18h12m15s"}}},
		{"packet size not a number", "broker:\n  max_packet_size: large\n",
			[]wantProblem{{2, "broker.max_packet_size", "want a whole number"}}},
		{"packet size zero", "broker:\n  max_packet_size: 0\n",
			[]wantProblem{{2, "broker.max_packet_size", "use 1 to 268435460 bytes"}}},
		{"empty storage path", "storage:\n  path: \"\"\n",
			[]wantProblem{{2, "storage.path", "required"}}},
		{"unknown queue policy", "storage:\n  queue_policy: drop_newest\n",
			[]wantProblem{{2, "storage.queue_policy", "use one of drop_oldest, refuse"}}},
		{"store budget below one session's", "storage:\n  max_queued_bytes: 1000\n",
			[]wantProblem{{2, "storage.max_queued_bytes", "smaller than broker.max_queued_bytes"}}},
		{"acl rule with a bad filter", "broker:\n  acl:\n    - {user: a, topic: \"x/#/y\", access: read}\n",
			[]wantProblem{{3, "broker.acl[0].topic", "not a valid topic filter"}}},
		{"acl rule with an unknown access", "broker:\n  acl:\n    - {topic: x, access: all}\n",
			[]wantProblem{{3, "broker.acl[0].access", "use one of read, write, readwrite, deny"}}},
		{"inflight timeout too short", "broker:\n  inflight_timeout: 10ms\n",
			[]wantProblem{{2, "broker.inflight_timeout", "use 1s or more"}}},
		{"queued bytes below one packet", "broker:\n  max_queued_bytes: 100\n",
			[]wantProblem{{2, "broker.max_queued_bytes", "too small for broker.max_packet_size (262144): a queued message counts its bytes twice plus 256"}}},
		{"listener address without port", "listeners:\n  - name: a\n    type: tcp\n    address: 127.0.0.1\n",
			[]wantProblem{{4, "listeners[0].address", "use something like 127.0.0.1:1883"}}},
		{"listener bad port", "listeners:\n  - name: a\n    type: ws\n    address: ':http'\n",
			[]wantProblem{{4, "listeners[0].address", "port \"http\""}}},
		{"listener unknown type", "listeners:\n  - name: a\n    type: quic\n    address: ':1883'\n",
			[]wantProblem{{3, "listeners[0].type", "use one of tcp, tls, ws, wss, unix"}}},
		{"tls files missing", "listeners:\n  - name: secure\n    type: tls\n    address: ':8883'\n",
			[]wantProblem{{2, "listeners[0].tls.cert", "PEM certificate"}, {2, "listeners[0].tls.key", "PEM private key"}}},
		{"tls key missing points at tls block", "listeners:\n  - name: secure\n    type: wss\n    address: ':8443'\n    tls:\n      cert: c.pem\n",
			[]wantProblem{{5, "listeners[0].tls.key", "PEM private key"}}},
		{"tls on a plain listener", "listeners:\n  - name: a\n    type: tcp\n    address: ':1883'\n    tls: {cert: c.pem, key: k.pem}\n",
			[]wantProblem{{5, "listeners[0].tls", "use type tls or wss, or remove tls"}}},
		{"allowed origin without a scheme", "listeners:\n  - name: web\n    type: ws\n    address: ':8080'\n    allowed_origins:\n      - https://ok.example\n      - dashboard.example.com\n",
			[]wantProblem{{7, "listeners[0].allowed_origins[1]", `"dashboard.example.com" has no scheme; write an origin as a browser sends it, scheme://host[:port]`}}},
		{"allowed origin with a path", "listeners:\n  - {name: web, type: wss, address: ':8443', tls: {cert: c, key: k}, allowed_origins: ['https://ok.example/app']}\n",
			[]wantProblem{{2, "listeners[0].allowed_origins[0]", "has a path"}}},
		{"allowed origins on a tcp listener", "listeners:\n  - name: a\n    type: tcp\n    address: ':1883'\n    allowed_origins: [https://ok.example]\n",
			[]wantProblem{{5, "listeners[0].allowed_origins", "use type ws or wss, or remove allowed_origins"}}},
		{"unix listener without path", "listeners:\n  - name: local\n    type: unix\n",
			[]wantProblem{{2, "listeners[0].address", "socket path"}}},
		{"duplicate listener names", "listeners:\n  - {name: a, type: tcp, address: ':1883'}\n  - {name: a, type: tcp, address: ':1884'}\n",
			[]wantProblem{{3, "listeners[1].name", "already the name of listeners[0] (line 2)"}}},
		{"wildcard clashes with loopback", "listeners:\n  - {name: a, type: tcp, address: ':1883'}\n  - {name: b, type: ws, address: '127.0.0.1:1883'}\n",
			[]wantProblem{{3, "listeners[1].address", "also bound by listeners[0].address (line 2)"}}},
		{"ops clashes with a listener", "ops:\n  address: 127.0.0.1:1883\n",
			[]wantProblem{{2, "ops.address", "also bound by listeners[0].address"}}},
		{"ops token too short", "ops:\n  token: secret\n",
			[]wantProblem{{2, "ops.token", "use at least 16"}}},
		{"ops connection bounds out of range", "ops:\n  idle_timeout: 0s\n  max_conns: 4\n  max_conns_per_source: 5\n",
			[]wantProblem{{2, "ops.idle_timeout", "use 1s to 5m0s"}, {4, "ops.max_conns_per_source", "use 1 to 4"}}},
		{"ops max_conns zero", "ops:\n  max_conns: 0\n  max_conns_per_source: 1\n",
			[]wantProblem{{2, "ops.max_conns", "use 1 to 1024"}}},
		{"listener name with slash", "listeners:\n  - {name: a/b, type: tcp, address: ':1883'}\n",
			[]wantProblem{{2, "listeners[0].name", "use letters, digits, - and _"}}},
		{"sensor interval zero and kind missing", "sensors:\n  - name: t1\n    bus: sim\n    interval: 0s\n",
			[]wantProblem{{2, "sensors[0].kind", "required"}, {4, "sensors[0].interval", "must be positive"}}},
		{"sensor interval missing", "sensors:\n  - name: t1\n    kind: bme280\n    bus: sim\n",
			[]wantProblem{{2, "sensors[0].interval", "must be positive, such as 10s"}}},
		{"duplicate sensor names", "sensors:\n  - {name: t, kind: bme280, bus: sim, interval: 1s}\n  - {name: t, kind: bme280, bus: sim, interval: 1s}\n",
			[]wantProblem{{3, "sensors[1].name", "already the name of sensors[0]"}}},
		{"list where a mapping belongs", "log:\n  - debug\n",
			[]wantProblem{{2, "log", "want a mapping with keys level, format"}}},
		{"mapping where a list belongs", "sensors:\n  name: t\n",
			[]wantProblem{{2, "sensors", "want a list"}}},
		{"key set twice", "log:\n  level: debug\n  level: info\n",
			[]wantProblem{{3, "log.level", "set twice (first on line 2)"}}},
		{"two documents", "log: {}\n---\nlog: {}\n",
			[]wantProblem{{2, "", "keep one document per file"}}},
		{"yaml syntax", "log: [debug\n",
			[]wantProblem{{1, "log", "YAML syntax"}}},
		{"empty file", "",
			[]wantProblem{{1, "", "the file has no settings"}}},
		{"comments only", "# log:\n#   level: debug\n",
			[]wantProblem{{1, "", "the file has no settings"}}},
		{"null document", "~\n",
			[]wantProblem{{1, "", "the file has no settings"}}},
		{"zero bound", "broker:\n  max_retained_bytes: 0\n",
			[]wantProblem{{2, "broker.max_retained_bytes", "0 is out of range"}}},
		{"a user's bound over the whole", "broker:\n  max_persistent_sessions: 10\n  max_persistent_sessions_per_user: 20\n",
			[]wantProblem{{3, "broker.max_persistent_sessions_per_user", "20 is more than broker.max_persistent_sessions (10)"}}},
		{"one filter over a session's filters", "broker:\n  max_filter_bytes: 20000\n",
			[]wantProblem{{2, "broker.max_filter_bytes", "20000 is more than broker.max_session_filter_bytes (16384)"}}},
		{"retained whole under a user's", "broker:\n  max_retained_messages: 100\n",
			[]wantProblem{{2, "broker.max_retained_messages", "100 is less than broker.max_retained_messages_per_user (2500)"}}},
		{"quoted number", "broker:\n  max_inflight: \"64\"\n",
			[]wantProblem{{2, "broker.max_inflight", `got "64"`}}},
		{"whole number beyond 64 bits", "broker:\n  max_packet_size: 99999999999999999999999\n",
			[]wantProblem{{2, "broker.max_packet_size", "99999999999999999999999 is out of range; a whole number here is from"}}},
		{"a fraction for a whole number", "sensors:\n  - {name: t, kind: bme280, bus: sim, interval: 1s, retries: 1.5}\n",
			[]wantProblem{{2, "sensors[0].retries", `want a whole number, got "1.5"`}}},
		{"infinite scale", "sensors:\n  - name: t\n    kind: ads1115\n    bus: sim\n    interval: 1s\n    channels:\n      - {name: p, input: A0, from: [0, .inf], to: [0, 10]}\n",
			[]wantProblem{{7, "sensors[0].channels[0].from[1]", `want a finite number, such as 2.5, got ".inf"`}}},
		{"NaN range", "sensors:\n  - name: t\n    kind: ads1115\n    bus: sim\n    interval: 1s\n    channels:\n      - {name: p, input: A0, range: [.nan, 1]}\n",
			[]wantProblem{{7, "sensors[0].channels[0].range[0]", "want a finite number"}}},
		{"number beyond float64", "sensors:\n  - name: t\n    kind: ads1115\n    bus: sim\n    interval: 1s\n    channels:\n      - {name: p, input: A0, to: [0, 1e999], from: [0, 1]}\n",
			[]wantProblem{{7, "sensors[0].channels[0].to[1]", "want a finite number"}}},
		{"duration beyond 64 bits", "broker:\n  max_keepalive: 10000000h\n",
			[]wantProblem{{2, "broker.max_keepalive", "10000000h is too long; a duration can be at most 2562047h47m16s"}}},
		{"a unit alone is no duration", "broker:\n  max_keepalive: s\n",
			[]wantProblem{{2, "broker.max_keepalive", `want a duration such as 30s, 5m or 1h30m, got "s"`}}},
		{"negative reconnect_min", "bridges:\n  - name: c\n    address: a:1\n    reconnect_min: -1s\n    out: [{filter: a}]\n",
			[]wantProblem{{4, "bridges[0].reconnect_min", "use a positive duration"}}},
		{"reconnect_min above the default reconnect_max", "bridges:\n  - name: c\n    address: a:1\n    reconnect_min: 5m\n    out: [{filter: a}]\n",
			[]wantProblem{{4, "bridges[0].reconnect_min", "want reconnect_min (5m0s) <= reconnect_max (2m0s)"}}},
		{"reconnect_max below reconnect_min", "bridges:\n  - name: c\n    address: a:1\n    reconnect_min: 5s\n    reconnect_max: 1s\n    out: [{filter: a}]\n",
			[]wantProblem{{5, "bridges[0].reconnect_max", "want reconnect_min (5s) <= reconnect_max (1s)"}}},
		{"session budget above the default store budget", "broker:\n  max_queued_bytes: 1999999999\n",
			[]wantProblem{{2, "broker.max_queued_bytes", "more than storage.max_queued_bytes (67108864)"}}},
		{"packet above the default session budget", "broker:\n  max_packet_size: 2000000\n",
			[]wantProblem{{2, "broker.max_packet_size", "too large for broker.max_queued_bytes (1048576)"}}},
		{"listener on the default ops address", "listeners:\n  - {name: a, type: tcp, address: ':9100'}\n",
			[]wantProblem{{2, "listeners[0].address", ":9100 is also bound by ops.address (by default)"}}},
		{"name too long", "sensors:\n  - {name: " + strings.Repeat("a", 65) + ", kind: bme280, bus: sim, interval: 1s}\n",
			[]wantProblem{{2, "sensors[0].name", "is 65 characters long; use at most 64"}}},
		{"topic prefix too long", "gateway:\n  topic_prefix: " + strings.Repeat("a", 70000) + "\n",
			[]wantProblem{{2, "gateway.topic_prefix", "longer than 65535 bytes"}}},
		{"topic prefix reserved", "gateway:\n  topic_prefix: $SYS\n",
			[]wantProblem{{2, "gateway.topic_prefix", "topics starting with $, so subscribers to # would not see them"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse("site.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse accepted a broken config: %+v", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config along with an error")
			}
			got := problemsOf(t, err)
			if len(got) != len(tt.want) {
				t.Errorf("got %d problems, want %d:\n%v", len(got), len(tt.want), err)
			}
			for _, w := range tt.want {
				if !hasProblem(got, w) {
					t.Errorf("missing problem site.yaml:%d: %s: ...%s...\ngot:\n%v", w.line, w.path, w.msg, err)
				}
			}
			for _, p := range got {
				if p.File != "site.yaml" || p.Line == 0 {
					t.Errorf("problem %q does not name file and line", p)
				}
			}
		})
	}
}

func hasProblem(ps []Problem, w wantProblem) bool {
	for _, p := range ps {
		if p.Line == w.line && p.Path == w.path && strings.Contains(p.Msg, w.msg) {
			return true
		}
	}
	return false
}

func TestEveryProblemReported(t *testing.T) {
	const doc = `log:
  level: loud
  format: xml
broker:
  max_keepalive: forever
listeners:
  - name: lan
    type: tls
    address: 0.0.0.0
  - name: lan
    type: tcp
    address: :1883
sensors:
  - name: soil
    kind: ""
    bus: "1"
    interval: -1s
extra: true
`
	_, err := Parse("many.yaml", []byte(doc))
	got := problemsOf(t, err)
	want := []wantProblem{
		{2, "log.level", "use one of"},
		{3, "log.format", "use one of text, json"},
		{5, "broker.max_keepalive", "want a duration"},
		{7, "listeners[0].tls.cert", "required"},
		{7, "listeners[0].tls.key", "required"},
		{9, "listeners[0].address", "not host:port"},
		{10, "listeners[1].name", "already the name"},
		{15, "sensors[0].kind", "required"},
		{17, "sensors[0].interval", "must be positive"},
		{18, "extra", "unknown key"},
	}
	if len(got) != len(want) {
		t.Errorf("got %d problems, want %d:\n%v", len(got), len(want), err)
	}
	for _, w := range want {
		if !hasProblem(got, w) {
			t.Errorf("missing problem at line %d %s", w.line, w.path)
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i].Line < got[i-1].Line {
			t.Errorf("problems not in file order: line %d after line %d", got[i].Line, got[i-1].Line)
		}
	}
	// One line per problem, so a terminal shows them as a list.
	if lines := strings.Count(err.Error(), "\n"); lines != len(got) {
		t.Errorf("Error() has %d line breaks for %d problems:\n%s", lines, len(got), err)
	}
}

func TestValidateConfigBuiltInCode(t *testing.T) {
	c := Default()
	c.Sensors = append(c.Sensors, sensors.Sensor{Name: "x", Kind: "bme280", Bus: "sim", Timeout: time.Second, MaxBackoff: time.Minute})
	err := c.Validate()
	ps := problemsOf(t, err)
	if len(ps) != 1 || ps[0].Path != "sensors[0].interval" {
		t.Fatalf("got %v, want one problem at sensors[0].interval", err)
	}
	// No file to point at: the message must not invent one.
	if got, want := ps[0].String(), "sensors[0].interval: must be positive, such as 10s"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("log:\n  level: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(good)
	if err != nil {
		t.Fatalf("Load(%s): %v", good, err)
	}
	if cfg.Log.SlogLevel() != slog.LevelDebug {
		t.Errorf("level = %v, want debug", cfg.Log.SlogLevel())
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("log:\n  level: debug\n  colour: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	if err == nil || !strings.Contains(err.Error(), bad+":3: log.colour: unknown key") {
		t.Errorf("Load(bad) = %v, want the file, line 3 and the key", err)
	}

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want an error wrapping fs.ErrNotExist", err)
	}
}

func TestSlogLevel(t *testing.T) {
	tests := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
	for name, want := range tests {
		if got := (Log{Level: name}).SlogLevel(); got != want {
			t.Errorf("SlogLevel(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{{"", "", 0}, {"level", "levle", 1}, {"adress", "address", 1}, {"kind", "bus", 4}}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestSensorItemsGetDefaultsAndOptions(t *testing.T) {
	doc := `sensors:
  - name: tank
    kind: ads1115
    bus: "1"
    interval: 5s
    retries: 0
    options: {max_voltage: 4.096, data_rate: 128}
    channels:
      - {name: pressure, input: A0, unit: bar, from: [0.4, 2.0], to: [0, 10], range: [-0.5, 10.5]}
outputs:
  - {name: pump, bus: gpio, pin: GPIO17}
`
	cfg, err := Parse("s.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Sensors[0]
	// Keys left out take the item defaults; an explicit 0 is kept.
	if s.Timeout != 2*time.Second || s.Jitter != time.Second || s.QoS != 1 || s.MaxBackoff != 5*time.Minute {
		t.Errorf("defaults not applied: %+v", s)
	}
	if s.Retries != 0 {
		t.Errorf("retries = %d, want the explicit 0", s.Retries)
	}
	if s.Options["max_voltage"] != "4.096" || s.Options["data_rate"] != "128" {
		t.Errorf("options = %v", s.Options)
	}
	ch := s.Channels[0]
	if ch.From[1] != 2.0 || ch.To[1] != 10 || ch.Range[0] != -0.5 || ch.Decimals != 3 {
		t.Errorf("channel = %+v", ch)
	}
	if o := cfg.Outputs[0]; o.SafeState != "off" || o.QoS != 1 || o.Pin != "GPIO17" {
		t.Errorf("output = %+v", o)
	}
	if cfg.Gateway.TopicPrefix != "fieldgate" || !cfg.Gateway.Discovery {
		t.Errorf("gateway = %+v", cfg.Gateway)
	}
}

func TestSensorAndOutputProblems(t *testing.T) {
	doc := `gateway: {name: "a b", topic_prefix: "x/+"}
sensors:
  - name: tank
    kind: ads1115
    bus: "1"
    interval: 5s
    qos: 3
    options: {max_voltage: [1, 2]}
    channels:
      - {name: p, input: A0, from: [0.4], to: [0, 10], range: [5, 1]}
      - {name: q, input: A1, from: [1, 1], to: [0, 10], decimals: x}
outputs:
  - {name: tank, bus: spi, safe_state: maybe}
`
	_, err := Parse("p.yaml", []byte(doc))
	got := problemsOf(t, err)
	for _, w := range []wantProblem{
		{1, "gateway.name", "contains"},
		{1, "gateway.topic_prefix", "cannot begin a topic"},
		{7, "sensors[0].qos", "out of range"},
		{8, "sensors[0].options.max_voltage", "want a single value"},
		{10, "sensors[0].channels[0].from", "two numbers each"},
		{10, "sensors[0].channels[0].range", "low below high"},
		{11, "sensors[0].channels[1].decimals", "want a whole number"},
		{13, "outputs[0].name", "already the name"},
		{13, "outputs[0].bus", "use one of gpio, sim"},
		{13, "outputs[0].pin", "required"},
		{13, "outputs[0].safe_state", "use one of off, on"},
	} {
		if !hasProblem(got, w) {
			t.Errorf("missing problem at line %d %s (%s); got:\n%v", w.line, w.path, w.msg, err)
		}
	}
}

func TestBridgeDefaultsAndProblems(t *testing.T) {
	good := `bridges:
  - name: cloud
    address: mqtt.example.com:8883
    tls: {enabled: true, ca_file: /etc/fieldgate/ca.pem}
    out:
      - {filter: "fieldgate/{device}/#", topic: "sites/{device}/{3}/{4}"}
      - {filter: "alarms/#", class: alarm, qos: 2}
      - {filter: "debug/#", qos: 0, memory_only: true}
    in:
      - {filter: "commands/{device}/#", topic: "fieldgate/{device}/{3}/set"}
`
	cfg, err := Parse("b.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	b := cfg.Bridges[0]
	if b.Protocol != "auto" || b.KeepAlive != time.Minute || b.ReconnectMax != 2*time.Minute || b.MaxInflight != 32 || b.MaxOutboxBytes != 64<<20 {
		t.Errorf("bridge defaults not applied: %+v", b)
	}
	if r := b.Out[0]; r.QoS != 1 || r.Class != bridge.ClassTelemetry {
		t.Errorf("out-route defaults not applied: %+v", r)
	}
	if r := b.In[0]; r.QoS != 1 {
		t.Errorf("in-route defaults not applied: %+v", r)
	}

	bad := `bridges:
  - name: cloud
    address: nowhere
    protocol: "4"
    password: x
    password_file: /p
    tls: {cert: c.pem}
    out:
      - {filter: "a/#/b", topic: "x/{nope}"}
      - {filter: "a/#", class: urgent, qos: 1, memory_only: true}
    in:
      - {filter: "", topic: "x/+"}
  - name: cloud
    address: a:1
`
	_, err = Parse("bad.yaml", []byte(bad))
	got := problemsOf(t, err)
	for _, w := range []wantProblem{
		{3, "bridges[0].address", "not host:port"},
		{4, "bridges[0].protocol", "use one of auto, 5, 3.1.1"},
		{6, "bridges[0].password_file", "keep one"},
		{7, "bridges[0].tls.key", "set both or neither"},
		{7, "bridges[0].tls.enabled", "set it to true"},
		{9, "bridges[0].out[0].filter", "not a valid topic filter"},
		{9, "bridges[0].out[0].topic", "unknown placeholder {nope}"},
		{10, "bridges[0].out[1].class", "use one of telemetry, alarm, state"},
		{10, "bridges[0].out[1].memory_only", "only for qos 0"},
		{12, "bridges[0].in[0].filter", "required"},
		{12, "bridges[0].in[0].topic", "does not make a valid topic"},
		{13, "bridges[1].name", "already the name"},
		{13, "bridges[1]", "has no routes"},
	} {
		if !hasProblem(got, w) {
			t.Errorf("missing problem at line %d %s (%s); got:\n%v", w.line, w.path, w.msg, err)
		}
	}
}
