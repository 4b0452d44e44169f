package reliability

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fieldgate/fieldgate/internal/relrecord"
	"github.com/fieldgate/fieldgate/internal/testkit"
)

// badconfigCase is one broken configuration file and the problem
// `fieldgate check` must report for it: FILE:LINE: KEY: message.
type badconfigCase struct {
	name string
	yaml string
	line int    // the line the problem is reported on
	key  string // the key path printed after the line; "" for the file as a whole
	hint string // part of the message that says what would be right
	// run also has `fieldgate run` refuse the file, with a storage.path
	// added at its end, without creating or touching the state file.
	run bool
}

// badconfigYAML joins lines into a file, so that a case's line numbers
// can be read off its arguments.
func badconfigYAML(lines ...string) string {
	return strings.Join(lines, "\n") + "\n"
}

// badconfigSensor is a good simulated sensor of kind at address, with
// extra lines from line 7 on.
func badconfigSensor(kind, address string, extra ...string) string {
	return badconfigYAML(append([]string{
		"sensors:",
		"  - name: probe",
		"    kind: " + kind,
		"    bus: sim",
		"    address: " + strconv.Quote(address),
		"    interval: 10s",
	}, extra...)...)
}

// badconfigBridge is a good bridge with one out-route, with extra lines
// from line 4 on and its routes after them.
func badconfigBridge(extra ...string) string {
	lines := append([]string{
		"bridges:",
		"  - name: cloud",
		"    address: mqtt.example.com:8883",
	}, extra...)
	return badconfigYAML(append(lines, "    out:", `      - {filter: "fieldgate/#"}`)...)
}

// badconfigCases cover every section of the file and the ways YAML itself
// goes wrong. Each is broken in one place.
var badconfigCases = []badconfigCase{
	// log
	{name: "log level unknown", yaml: badconfigYAML("log:", "  level: loud"),
		line: 2, key: "log.level", hint: "use one of debug, info, warn, error", run: true},
	{name: "log format unknown", yaml: badconfigYAML("log:", "  level: info", "  format: yaml"),
		line: 3, key: "log.format", hint: "use one of text, json"},

	// storage
	{name: "storage path a directory", yaml: badconfigYAML("storage:", "  path: /var/lib/fieldgate/"),
		line: 2, key: "storage.path", hint: "name the file, such as /var/lib/fieldgate/state.db"},
	{name: "storage queue policy unknown", yaml: badconfigYAML("storage:", "  queue_policy: drop_newest"),
		line: 2, key: "storage.queue_policy", hint: "use one of drop_oldest, refuse"},
	{name: "storage budget below a session's", yaml: badconfigYAML("storage:", "  max_queued_bytes: 1000"),
		line: 2, key: "storage.max_queued_bytes", hint: "smaller than broker.max_queued_bytes (1048576), the budget of one session; use at least that"},

	// broker
	{name: "broker packet size beyond MQTT", yaml: badconfigYAML("broker:", "  max_packet_size: 300000000"),
		line: 2, key: "broker.max_packet_size", hint: "use 1 to 268435460 bytes"},
	{name: "broker keepalive in fractions", yaml: badconfigYAML("broker:", "  max_keepalive: 1.5s"),
		line: 2, key: "broker.max_keepalive", hint: "use whole seconds from 1s to 18h12m15s"},
	{name: "broker session budget above the store's", yaml: badconfigYAML("broker:", "  allow_anonymous: true", "  max_queued_bytes: 999999999999"),
		line: 3, key: "broker.max_queued_bytes", hint: "use at most that, or raise storage.max_queued_bytes"},
	{name: "broker packet above the session budget", yaml: badconfigYAML("broker:", "  allow_anonymous: true", "  max_packet_size: 2000000"),
		line: 3, key: "broker.max_packet_size", hint: "use at most 524160, or raise broker.max_queued_bytes"},
	{name: "broker receive maximum zero", yaml: badconfigYAML("broker:", "  receive_maximum: 0"),
		line: 2, key: "broker.receive_maximum", hint: "use 1 to 65535"},
	{name: "broker session expiry negative", yaml: badconfigYAML("broker:", "  max_session_expiry: -1h"),
		line: 2, key: "broker.max_session_expiry", hint: "use whole seconds from 0s to"},
	{name: "broker $SYS interval negative", yaml: badconfigYAML("broker:", "  sys_interval: -10s"),
		line: 2, key: "broker.sys_interval", hint: "use 1s or more, or 0s to turn $SYS off"},
	{name: "broker ACL filter invalid", yaml: badconfigYAML("broker:", "  acl:", `    - {user: "*", topic: "devices/#/x", access: read}`),
		line: 3, key: "broker.acl[0].topic", hint: "'#' must be the last level"},
	{name: "broker ACL access unknown", yaml: badconfigYAML("broker:", "  acl:", "    - user: alice", "      topic: devices/alice/#", "      access: all"),
		line: 5, key: "broker.acl[0].access", hint: "use one of read, write, readwrite, deny"},

	// listeners
	{name: "listener port out of range", yaml: badconfigYAML("listeners:", "  - name: lan", "    type: tcp", "    address: 127.0.0.1:70000"),
		line: 4, key: "listeners[0].address", hint: "not a number from 0 to 65535", run: true},
	{name: "listener type unknown", yaml: badconfigYAML("listeners:", "  - name: lan", "    type: quic", "    address: :1883"),
		line: 3, key: "listeners[0].type", hint: "use one of tcp, tls, ws, wss, unix"},
	{name: "listener address without port", yaml: badconfigYAML("listeners:", "  - {name: lan, type: tcp, address: 192.168.1.10}"),
		line: 2, key: "listeners[0].address", hint: "use something like 127.0.0.1:1883"},
	{name: "listener names duplicate", yaml: badconfigYAML("listeners:", "  - {name: lan, type: tcp, address: 127.0.0.1:1883}", "  - {name: lan, type: tcp, address: 127.0.0.1:1884}"),
		line: 3, key: "listeners[1].name", hint: "already the name of listeners[0] (line 2); names must be unique", run: true},
	{name: "listener addresses conflict", yaml: badconfigYAML("listeners:", "  - {name: lan, type: tcp, address: 127.0.0.1:1883}", "  - {name: all, type: ws, address: 0.0.0.0:1883}"),
		line: 3, key: "listeners[1].address", hint: "also bound by listeners[0].address (line 2); give each its own address"},
	{name: "listener on the ops address", yaml: badconfigYAML("listeners:", "  - {name: lan, type: tcp, address: ':9100'}"),
		line: 2, key: "listeners[0].address", hint: "also bound by ops.address (by default)"},
	{name: "unix listeners share a path", yaml: badconfigYAML("listeners:", "  - {name: a, type: unix, address: /run/fieldgate/mqtt.sock}", "  - {name: b, type: unix, address: /run/fieldgate/mqtt.sock}"),
		line: 3, key: "listeners[1].address", hint: "give each its own address"},
	{name: "tls listener without cert", yaml: badconfigYAML("listeners:", "  - name: secure", "    type: tls", "    address: :8883", "    tls:", "      key: /etc/fieldgate/tls/server.key"),
		line: 5, key: "listeners[0].tls.cert", hint: "required for a tls listener: the PEM certificate file"},
	{name: "tls block on a tcp listener", yaml: badconfigYAML("listeners:", "  - name: lan", "    type: tcp", "    address: :1883", "    tls: {cert: s.pem, key: s.key}"),
		line: 5, key: "listeners[0].tls", hint: "use type tls or wss, or remove tls"},
	{name: "websocket without port", yaml: badconfigYAML("listeners:", "  - name: web", "    type: ws", "    address: 127.0.0.1"),
		line: 4, key: "listeners[0].address", hint: "use something like 127.0.0.1:8080"},
	{name: "secure websocket without key", yaml: badconfigYAML("listeners:", "  - name: web", "    type: wss", "    address: :8443", "    tls:", "      cert: /etc/fieldgate/tls/server.pem"),
		line: 5, key: "listeners[0].tls.key", hint: "required for a wss listener: the PEM private key file"},

	// ops
	{name: "ops address without port", yaml: badconfigYAML("ops:", "  address: localhost"),
		line: 2, key: "ops.address", hint: "use something like 127.0.0.1:9100"},
	{name: "ops token short", yaml: badconfigYAML("ops:", "  token: secret"),
		line: 2, key: "ops.token", hint: "use at least 16"},

	// gateway
	{name: "gateway name with a space", yaml: badconfigYAML("gateway:", "  name: green house"),
		line: 2, key: "gateway.name", hint: "use letters, digits, - and _"},
	{name: "gateway prefix with a wildcard", yaml: badconfigYAML("gateway:", `  topic_prefix: "fieldgate/#"`),
		line: 2, key: "gateway.topic_prefix", hint: "use levels without wildcards"},
	{name: "gateway prefix very long", yaml: badconfigYAML("gateway:", "  topic_prefix: "+strings.Repeat("a", 70000)),
		line: 2, key: "gateway.topic_prefix", hint: "longer than 65535 bytes"},

	// sensors
	{name: "sensor kind unknown", yaml: badconfigSensor("bme281", "0x76"),
		line: 3, key: "sensors[0].kind", hint: "use one of ads1015, ads1115, bme280, bmp280, ds18b20, gpio_in, ina219, sht3x, sht4x"},
	{name: "sensor bus unknown", yaml: strings.Replace(badconfigSensor("bme280", "0x76"), "bus: sim", "bus: spi", 1),
		line: 4, key: "sensors[0].bus", hint: "use its number such as 1 (for /dev/i2c-1), or sim"},
	{name: "bme280 at another chip's address", yaml: badconfigSensor("bme280", "0x48"),
		line: 5, key: "sensors[0].address", hint: "answers only at 0x76 or 0x77"},
	{name: "ina219 address beyond 7 bits", yaml: badconfigSensor("ina219", "0x80"),
		line: 5, key: "sensors[0].address", hint: "not a 7-bit I²C address; use one such as 0x40"},
	{name: "bme280 option value unknown", yaml: badconfigSensor("bme280", "0x76", "    options: {oversampling: 3x}"),
		line: 7, key: "sensors[0].options.oversampling", hint: "use one of 1x, 2x, 4x, 8x, 16x", run: true},
	{name: "sht3x option misspelled", yaml: badconfigSensor("sht3x", "0x44", "    options:", "      precison: high"),
		line: 8, key: "sensors[0].options.precison", hint: "unknown option for sht3x; known options: precision"},
	{name: "sensor options not a mapping", yaml: badconfigSensor("sht4x", "0x44", "    options: high"),
		line: 7, key: "sensors[0].options", hint: "want a mapping of names to values"},
	{name: "ina219 shunt against the default current", yaml: badconfigSensor("ina219", "0x40", "    options:", "      shunt_ohms: 1"),
		line: 8, key: "sensors[0].options.shunt_ohms", hint: "use a max_current from 0.0205 to 0.32 A, or another shunt"},
	{name: "sensor interval negative", yaml: strings.Replace(badconfigSensor("bme280", "0x76"), "10s", "-10s", 1),
		line: 6, key: "sensors[0].interval", hint: "must be positive, such as 10s"},
	{name: "sensor interval without unit", yaml: strings.Replace(badconfigSensor("bme280", "0x76"), "10s", "10", 1),
		line: 6, key: "sensors[0].interval", hint: "add a unit: 10s"},
	{name: "sensor jitter negative", yaml: badconfigSensor("bme280", "0x76", "    jitter: -1s"),
		line: 7, key: "sensors[0].jitter", hint: "use 0s or more, such as 1s"},
	{name: "sensor qos a word", yaml: badconfigSensor("bme280", "0x76", "    qos: one"),
		line: 7, key: "sensors[0].qos", hint: `want a whole number, got "one"`},
	{name: "sensor qos a fraction", yaml: badconfigSensor("bme280", "0x76", "    qos: 1.5"),
		line: 7, key: "sensors[0].qos", hint: `want a whole number, got "1.5"`},
	{name: "sensor channels on a bme280", yaml: badconfigSensor("bme280", "0x76", "    channels:", "      - {name: level, input: A0}"),
		line: 7, key: "sensors[0].channels", hint: "bme280 has no channels; remove channels"},
	{name: "ads1115 without channels", yaml: badconfigSensor("ads1115", "0x48"),
		line: 2, key: "sensors[0].channels", hint: "required: at least one input, such as {name: level, input: A0}"},
	{name: "ads1115 channel input unknown", yaml: badconfigSensor("ads1115", "0x48", "    channels:", "      - {name: level, input: A4}"),
		line: 8, key: "sensors[0].channels[0].input", hint: "use one of A0, A1, A2, A3, A0-A1, A0-A3, A1-A3, A2-A3"},
	{name: "ads1015 data rate of an ads1115", yaml: badconfigSensor("ads1015", "0x48", "    options: {data_rate: 860}", "    channels:", "      - {name: level, input: A0}"),
		line: 7, key: "sensors[0].options.data_rate", hint: "use one of 128, 250, 490, 920, 1600, 2400, 3300"},
	{name: "channel scale ends equal", yaml: badconfigSensor("ads1115", "0x48", "    channels:", "      - name: level", "        input: A0", "        from: [1, 1]", "        to: [0, 10]"),
		line: 10, key: "sensors[0].channels[0].from", hint: "the scale needs two different values"},
	{name: "channel range infinite", yaml: badconfigSensor("ads1115", "0x48", "    channels:", "      - name: level", "        input: A0", "        range: [0, .inf]"),
		line: 10, key: "sensors[0].channels[0].range[1]", hint: "want a finite number, such as 2.5"},
	{name: "channel names duplicate", yaml: badconfigSensor("ads1115", "0x48", "    channels:", "      - {name: level, input: A0}", "      - {name: level, input: A1}"),
		line: 9, key: "sensors[0].channels[1].name", hint: "already the name of sensors[0].channels[0] (line 8)"},
	{name: "ds18b20 id malformed", yaml: strings.Replace(badconfigSensor("ds18b20", "28-XYZ"), "bus: sim", "bus: w1", 1),
		line: 5, key: "sensors[0].address", hint: "such as 28-0316a279f3ff"},
	{name: "ds18b20 on an I2C bus", yaml: strings.Replace(badconfigSensor("ds18b20", "28-0316a279f3ff"), "bus: sim", `bus: "1"`, 1),
		line: 4, key: "sensors[0].bus", hint: "use w1 (the kernel's 1-Wire bus), or sim"},
	{name: "gpio_in mode unknown", yaml: badconfigSensor("gpio_in", "SIM_IN0", "    options: {mode: pulse}"),
		line: 7, key: "sensors[0].options.mode", hint: "use one of state, counter"},
	{name: "gpio_in debounce without unit", yaml: badconfigSensor("gpio_in", "SIM_IN0", "    options:", "      debounce: 20"),
		line: 8, key: "sensors[0].options.debounce", hint: "use a duration from 0s to 10s, such as 20ms"},
	{name: "gpio_in without a pin", yaml: badconfigYAML("sensors:", "  - name: door", "    kind: gpio_in", "    bus: gpio", "    interval: 10s"),
		line: 2, key: "sensors[0].address", hint: "required: the pin name, such as GPIO17"},
	{name: "sensor names duplicate", yaml: badconfigYAML("sensors:", "  - {name: t, kind: bme280, bus: sim, interval: 10s}", "  - {name: t, kind: sht3x, bus: sim, interval: 10s}"),
		line: 3, key: "sensors[1].name", hint: "already the name of sensors[0] (line 2); names must be unique"},
	{name: "sensor name very long", yaml: badconfigYAML("sensors:", "  - {name: "+strings.Repeat("t", 5000)+", kind: bme280, bus: sim, interval: 10s}"),
		line: 2, key: "sensors[0].name", hint: "is 5000 characters long; use at most 64"},

	// outputs
	{name: "output bus unknown", yaml: badconfigYAML("outputs:", "  - name: pump", "    bus: spi", "    pin: GPIO17"),
		line: 3, key: "outputs[0].bus", hint: "use one of gpio, sim"},
	{name: "output safe state unknown", yaml: badconfigYAML("outputs:", "  - name: pump", "    bus: sim", "    pin: SIM_OUT0", "    safe_state: closed"),
		line: 5, key: "outputs[0].safe_state", hint: "use one of off, on"},
	{name: "output named like a sensor", yaml: badconfigYAML("sensors:", "  - {name: pump, kind: bme280, bus: sim, interval: 10s}", "outputs:", "  - {name: pump, bus: sim, pin: SIM_OUT0}"),
		line: 4, key: "outputs[0].name", hint: "already the name of sensors[0] (line 2)"},

	// bridges, their routes, templates, TLS, credentials and budgets
	{name: "bridge route qos out of range", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883", "    out:", `      - {filter: "a/#"}`, `      - {filter: "b/#", qos: 3}`),
		line: 6, key: "bridges[0].out[1].qos", hint: "use 0 to 2, such as 1", run: true},
	{name: "bridge route class unknown", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883", "    out:", "      - filter: alarms/#", "        class: urgent"),
		line: 6, key: "bridges[0].out[0].class", hint: "use one of telemetry, alarm, state"},
	{name: "bridge route memory_only at qos 1", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883", "    out:", "      - {filter: debug/#, memory_only: true}"),
		line: 5, key: "bridges[0].out[0].memory_only", hint: "only for qos 0 routes"},
	{name: "bridge filter # not last", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883", "    in:", "      - filter: commands/#/set"),
		line: 5, key: "bridges[0].in[0].filter", hint: "'#' must be the last level"},
	{name: "bridge template placeholder unknown", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883", "    out:", "      - filter: fieldgate/#", `        topic: "sites/{levels}"`),
		line: 6, key: "bridges[0].out[0].topic", hint: "use {topic}, {device} or a level number such as {2}"},
	{name: "bridge template brace not closed", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883", "    in:", "      - filter: commands/+", `        topic: "fieldgate/{2"`),
		line: 6, key: "bridges[0].in[0].topic", hint: "has a { without its }"},
	{name: "bridge without routes", yaml: badconfigYAML("bridges:", "  - name: cloud", "    address: mqtt.example.com:8883"),
		line: 2, key: "bridges[0]", hint: "add out: or in: routes"},
	{name: "bridge names duplicate", yaml: badconfigYAML("bridges:", "  - {name: cloud, address: a.example.com:8883, out: [{filter: a/#}]}", "  - {name: cloud, address: b.example.com:8883, out: [{filter: b/#}]}"),
		line: 3, key: "bridges[1].name", hint: "already the name of bridges[0] (line 2)"},
	{name: "bridge address without port", yaml: strings.Replace(badconfigBridge(), "mqtt.example.com:8883", "mqtt.example.com", 1),
		line: 3, key: "bridges[0].address", hint: "use something like mqtt.example.com:8883"},
	{name: "bridge protocol unknown", yaml: badconfigBridge("    protocol: 3"),
		line: 4, key: "bridges[0].protocol", hint: "use one of auto, 5, 3.1.1"},
	{name: "bridge password and password file", yaml: badconfigBridge("    password: hunter2", "    password_file: /etc/fieldgate/cloud.pass"),
		line: 5, key: "bridges[0].password_file", hint: "set together with password; keep one"},
	{name: "bridge TLS cert without key", yaml: badconfigBridge("    tls:", "      enabled: true", "      cert: /etc/fieldgate/tls/gateway.pem"),
		line: 4, key: "bridges[0].tls.key", hint: "cert and key go together for mutual TLS; set both or neither"},
	{name: "bridge TLS settings while off", yaml: badconfigBridge("    tls:", "      enabled: false", "      ca_file: /etc/fieldgate/ca.pem"),
		line: 5, key: "bridges[0].tls.enabled", hint: "set it to true"},
	{name: "bridge keepalive negative", yaml: badconfigBridge("    keepalive: -1s"),
		line: 4, key: "bridges[0].keepalive", hint: "use 1s to 18h12m15s, such as 60s"},
	{name: "bridge reconnect_min negative", yaml: badconfigBridge("    reconnect_min: -1s"),
		line: 4, key: "bridges[0].reconnect_min", hint: "use a positive duration, such as 1s"},
	{name: "bridge outbox budget tiny", yaml: badconfigBridge("    max_outbox_bytes: 1000"),
		line: 4, key: "bridges[0].max_outbox_bytes", hint: "use 65536 to"},
	{name: "bridge dead-letter bound tiny", yaml: badconfigBridge("    max_dead_letter_bytes: 1000"),
		line: 4, key: "bridges[0].max_dead_letter_bytes", hint: "use 65536 to 1099511627776, such as 8388608 (8 MiB)"},

	// YAML itself
	{name: "syntax: list not closed", yaml: badconfigYAML("log:", "  level: info", "  format: [text", "storage:", "  path: /var/lib/fieldgate/state.db"),
		line: 3, key: "log.format", hint: "a list opened with [ is not closed with ]"},
	{name: "syntax: tab indentation", yaml: badconfigYAML("log:", "\tlevel: info"),
		line: 2, key: "log.level", hint: "indent with spaces", run: true},
	{name: "syntax: list item key misaligned", yaml: badconfigYAML("listeners:", "  - name: lan", "   type: tcp", "    address: :1883"),
		line: 3, key: "listeners[0].type", hint: "indent the key like the ones above it"},
	{name: "syntax: quote not closed", yaml: badconfigYAML("ops:", "  address: 127.0.0.1:9100", "  token: 'abc"),
		line: 3, key: "ops.token", hint: "a quoted value is not closed"},
	{name: "syntax: unquoted :port", yaml: badconfigYAML("listeners:", "  - {name: lan, type: tcp, address: :1883}"),
		line: 2, key: "listeners[0]", hint: "needs quotes"},
	{name: "syntax: second colon", yaml: badconfigYAML("gateway:", "  name: site: 7"),
		line: 2, key: "gateway.name", hint: `quote a value that contains ": "`},
	{name: "unknown top-level key", yaml: badconfigYAML("log:", "  level: info", "logging:", "  level: debug"),
		line: 3, key: "logging", hint: "unknown key; known keys here: log, storage, broker, listeners, ops, gateway, sensors, outputs, bridges"},
	{name: "misspelled key", yaml: badconfigYAML("listeners:", "  - name: lan", "    type: tcp", "    adress: :1883"),
		line: 4, key: "listeners[0].adress", hint: `unknown key (did you mean "address"?)`, run: true},
	{name: "string for a number", yaml: badconfigYAML("broker:", "  max_packet_size: big"),
		line: 2, key: "broker.max_packet_size", hint: `want a whole number, got "big"`},
	{name: "word for a boolean", yaml: badconfigYAML("broker:", "  allow_anonymous: maybe"),
		line: 2, key: "broker.allow_anonymous", hint: "want true or false"},
	{name: "number beyond 64 bits", yaml: badconfigYAML("broker:", "  max_packet_size: 99999999999999999999999"),
		line: 2, key: "broker.max_packet_size", hint: "is out of range; a whole number here is from"},
	{name: "duration beyond 64 bits", yaml: badconfigYAML("broker:", "  inflight_timeout: 10000000h"),
		line: 2, key: "broker.inflight_timeout", hint: "is too long; a duration can be at most 2562047h47m16s"},
	{name: "key set twice", yaml: badconfigYAML("log:", "  level: info", "  format: text", "  level: debug"),
		line: 4, key: "log.level", hint: "set twice (first on line 2); keep one"},
	{name: "list where a mapping belongs", yaml: badconfigYAML("log:", "  - level: debug"),
		line: 2, key: "log", hint: "want a mapping with keys level, format, got a list"},
	{name: "mapping where a list belongs", yaml: badconfigYAML("listeners:", "  name: lan", "  type: tcp"),
		line: 2, key: "listeners", hint: `want a list (items starting with "- ")`},
	{name: "two documents", yaml: badconfigYAML("log:", "  level: info", "---", "log:", "  level: debug"),
		line: 3, key: "", hint: "keep one document per file"},
	{name: "empty file", yaml: "",
		line: 1, key: "", hint: "the file has no settings; write the configuration in it"},
	{name: "comments only", yaml: badconfigYAML("# log:", "#   level: debug"),
		line: 1, key: "", hint: "the file has no settings"},
	{name: "not UTF-8", yaml: badconfigYAML("gateway:", "  name: gew\xe4chshaus"),
		line: 2, key: "gateway.name", hint: "not UTF-8 text: byte 0xe4 at column 12; save the file as UTF-8", run: true},
}

// badconfigFileCase is a configuration whose shape is right but which
// names a file the gateway cannot read. `fieldgate check` does not open
// such files, as the README says: they need exist only where the service
// runs (a systemd credential exists only for the service). `fieldgate run`
// must refuse to start, naming the key and the file.
type badconfigFileCase struct {
	name string
	yaml string // lines after the common head; DIR stands for the case's directory
	key  string // the key run's error names
	// setup puts what the case needs into dir.
	setup func(t *testing.T, dir string)
}

var badconfigFileCases = []badconfigFileCase{
	{name: "tls cert missing", key: "tls.cert", yaml: badconfigYAML(
		"listeners:",
		"  - name: secure",
		"    type: tls",
		"    address: 127.0.0.1:0",
		"    tls: {cert: DIR/server.pem, key: DIR/server.key}")},
	{name: "tls cert a directory", key: "tls.cert", yaml: badconfigYAML(
		"listeners:",
		"  - name: secure",
		"    type: tls",
		"    address: 127.0.0.1:0",
		"    tls: {cert: DIR/server.pem, key: DIR/server.key}"),
		setup: func(t *testing.T, dir string) {
			badconfigMkdir(t, filepath.Join(dir, "server.pem"))
		}},
	{name: "tls cert not PEM", key: "tls.cert", yaml: badconfigYAML(
		"listeners:",
		"  - name: secure",
		"    type: wss",
		"    address: 127.0.0.1:0",
		"    tls: {cert: DIR/server.pem, key: DIR/server.key}"),
		setup: func(t *testing.T, dir string) {
			badconfigWrite(t, filepath.Join(dir, "server.pem"), "not a certificate\n")
			badconfigWrite(t, filepath.Join(dir, "server.key"), "not a key\n")
		}},
	{name: "tls client CA missing", key: "tls.client_ca", yaml: badconfigYAML(
		"listeners:",
		"  - name: secure",
		"    type: tls",
		"    address: 127.0.0.1:0",
		"    tls: {cert: DIR/server.pem, key: DIR/server.key, client_ca: DIR/clients.pem}"),
		setup: badconfigCert},
	{name: "password file missing", key: "broker.password_file", yaml: badconfigYAML(
		"broker:",
		"  password_file: DIR/passwd")},
	{name: "bridge password file missing", key: "password_file", yaml: badconfigYAML(
		"bridges:",
		"  - name: cloud",
		"    address: 127.0.0.1:1",
		"    password_file: DIR/cloud.pass",
		"    out: [{filter: fieldgate/#}]")},
	{name: "bridge CA file missing", key: "tls.ca_file", yaml: badconfigYAML(
		"bridges:",
		"  - name: cloud",
		"    address: 127.0.0.1:1",
		"    tls: {enabled: true, ca_file: DIR/ca.pem}",
		"    out: [{filter: fieldgate/#}]")},
}

// badconfigFileHead starts every file case: nothing bound that another
// test could want, and the state file in the case's directory.
const badconfigFileHead = `storage:
  path: DIR/state.db
ops:
  address: ""
`

// badconfigTimeout bounds one run of the binary on a file it must refuse
// at once; it is long only for a loaded machine, and on the suite's time
// scale.
var badconfigTimeout = testkit.Scale(30 * time.Second)

// badconfigResult is what one run of the binary did.
type badconfigResult struct {
	code           int // the exit status; -1 when it had to be killed
	stdout, stderr string
}

// badconfigExec runs the binary and waits for it to exit.
func badconfigExec(t *testing.T, bin string, args ...string) badconfigResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), badconfigTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	configureProc(cmd)
	err := cmd.Run()
	r := badconfigResult{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.code = -1
		t.Errorf("fieldgate %s was still running after %s", strings.Join(args, " "), badconfigTimeout)
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("fieldgate %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// badconfigMatch returns the line of r's output that reports the problem
// of case c at path, and what is wrong with r, or "".
func badconfigMatch(c badconfigCase, path string, r badconfigResult) (match, why string) {
	if r.code != 1 {
		return "", fmt.Sprintf("exit status %d, want 1 (a configuration problem)", r.code)
	}
	if r.stdout != "" {
		return "", fmt.Sprintf("printed %q on stdout", r.stdout)
	}
	want := fmt.Sprintf("%s:%d: ", path, c.line)
	if c.key != "" {
		want += c.key + ": "
	}
	for _, l := range strings.Split(strings.TrimRight(r.stderr, "\n"), "\n") {
		// Every problem is placed, not only the one the case is about.
		rest, ok := strings.CutPrefix(l, path+":")
		num, _, _ := strings.Cut(rest, ":")
		if n, err := strconv.Atoi(num); !ok || err != nil || n < 1 {
			return "", fmt.Sprintf("%q does not start with the file and a line", l)
		}
		if match == "" && strings.HasPrefix(l, want) && strings.Contains(l, c.hint) {
			match = l
		}
	}
	if match == "" {
		return "", fmt.Sprintf("no line starts %q and says %q", want, c.hint)
	}
	return match, ""
}

// badconfigShown is the first line of out as the report shows it: the
// file as FILE, its directory as DIR, and a very long line shortened.
func badconfigShown(out, path, dir string) string {
	first, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	first = strings.ReplaceAll(strings.ReplaceAll(first, path, "FILE"), dir, "DIR")
	if utf8.RuneCountInString(first) > 240 {
		first = string([]rune(first)[:240]) + "…"
	}
	return first
}

// badconfigErrLog is the error a failed `fieldgate run` logged: the err
// field of its last level=ERROR line.
var badconfigErrLog = regexp.MustCompile(`level=ERROR .*err="((?:[^"\\]|\\.)*)"`)

// TestBadConfig runs `fieldgate check` on broken files, one per case in
// badconfigCases: each must be refused with a line naming the file, the
// line, the key and what would be right. A few are also given to
// `fieldgate run`, which must refuse them before it creates or touches
// the state file. Files naming TLS or password files that cannot be read
// pass check, which does not open them, and must stop run, also before it
// creates the state file, with the key and line in its error.
func TestBadConfig(t *testing.T) {
	rec := relrecord.Begin(t, "bad-config", "fieldgate check")
	bin := buildGateway(t, t.TempDir())
	dir := t.TempDir()

	// The good file passes: the refusals below are about the files.
	good, err := filepath.Abs(filepath.Join("..", "config", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if r := badconfigExec(t, bin, "check", "-config", good); r.code != 0 || r.stdout != "ok: "+good+"\n" {
		rec.Fail("the good configuration is refused")
		t.Fatalf("fieldgate check -config %s: exit %d, want 0 and ok\n%s%s", good, r.code, r.stdout, r.stderr)
	}

	type figure struct{ name, value string }
	var shown []figure
	rejected := 0
	paths := make([]string, len(badconfigCases))
	for i, c := range badconfigCases {
		paths[i] = filepath.Join(dir, fmt.Sprintf("case%02d.yaml", i))
		t.Run("check/"+c.name, func(t *testing.T) {
			badconfigWrite(t, paths[i], c.yaml)
			r := badconfigExec(t, bin, "check", "-config", paths[i])
			match, why := badconfigMatch(c, paths[i], r)
			if match == "" {
				match = r.stderr + r.stdout
			}
			// The line about the case, which is not always the first.
			shown = append(shown, figure{c.name, badconfigShown(match, paths[i], dir)})
			if why != "" {
				rec.Fail("%s: %s", c.name, why)
				t.Errorf("%s\nfile:\n%s\noutput:\n%s%s", why, c.yaml, r.stdout, r.stderr)
				return
			}
			rejected++
		})
	}
	rec.Add("configs", "%d", len(badconfigCases))
	rec.Add("rejected naming key and line", "%d of %d", rejected, len(badconfigCases))

	refused, runs := 0, 0
	for i, c := range badconfigCases {
		if !c.run {
			continue
		}
		runs++
		t.Run("run/"+c.name, func(t *testing.T) {
			// Every other case finds a state file there already.
			state := filepath.Join(dir, fmt.Sprintf("state%02d.db", i))
			if why := badconfigRefuses(t, bin, c, paths[i], state, runs%2 == 0); why != "" {
				rec.Fail("run, %s: %s", c.name, why)
				t.Error(why)
				return
			}
			refused++
		})
	}
	rec.Add("run refused without touching the state file", "%d of %d", refused, runs)

	var created []string
	filesRefused := 0
	for i, c := range badconfigFileCases {
		t.Run("files/"+c.name, func(t *testing.T) {
			cdir := filepath.Join(dir, fmt.Sprintf("files%02d", i))
			badconfigMkdir(t, cdir)
			if c.setup != nil {
				c.setup(t, cdir)
			}
			path := filepath.Join(cdir, "fieldgate.yaml")
			badconfigWrite(t, path, strings.ReplaceAll(badconfigFileHead+c.yaml, "DIR", cdir))
			check := badconfigExec(t, bin, "check", "-config", path)
			r := badconfigExec(t, bin, "run", "-config", path)
			logged := ""
			if m := badconfigErrLog.FindAllStringSubmatch(r.stderr, -1); len(m) > 0 {
				logged = m[len(m)-1][1]
				if s, err := strconv.Unquote(`"` + logged + `"`); err == nil {
					logged = s
				}
			}
			shown = append(shown, figure{"run: " + c.name, badconfigShown(logged, path, cdir)})
			if _, err := os.Stat(filepath.Join(cdir, "state.db")); err == nil {
				created = append(created, c.name)
			}
			t.Logf("check: exit %d %s", check.code, strings.TrimSpace(check.stdout+check.stderr))
			switch {
			case r.code != 1:
				rec.Fail("run, %s: exit status %d", c.name, r.code)
				t.Errorf("fieldgate run: exit status %d, want 1\n%s", r.code, r.stderr)
			case !badconfigPlaced(logged, path, strings.ReplaceAll(badconfigFileHead+c.yaml, "DIR", cdir), c.key):
				rec.Fail("run, %s: the error does not name the file, the line and %s", c.name, c.key)
				t.Errorf("fieldgate run's error %q does not say %s:LINE: ...%s: with the line of %s\n%s", logged, path, c.key, c.key, r.stderr)
			default:
				filesRefused++
			}
		})
	}
	// The gateway reads every file the configuration names before it
	// opens its state file: a refusal must leave none behind.
	if len(created) > 0 {
		rec.Fail("run created the state file before refusing: %s", strings.Join(created, ", "))
		t.Errorf("fieldgate run created the state file before refusing: %s", strings.Join(created, ", "))
	}
	rec.Add("unreadable files refused by run", "%d of %d (%d after creating the state file)", filesRefused, len(badconfigFileCases), len(created))

	for _, f := range shown {
		rec.Add(f.name, "%s", f.value)
	}
}

// badconfigRefuses has `fieldgate run` refuse the file of case c, written
// again with storage.path set to state at its end, and returns what went
// wrong, or "". With existing, a state file is there beforehand and must
// be left as it was; otherwise none may appear.
func badconfigRefuses(t *testing.T, bin string, c badconfigCase, path, state string, existing bool) string {
	t.Helper()
	if strings.Contains(c.yaml, "storage:") {
		t.Fatalf("case %q has a storage section; run needs its own", c.name)
	}
	runPath := strings.TrimSuffix(path, ".yaml") + "-run.yaml"
	badconfigWrite(t, runPath, c.yaml+"storage:\n  path: "+strconv.Quote(state)+"\n")
	sentinel := []byte("not a state file: a refused run must leave it as it is\n")
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if existing {
		badconfigWrite(t, state, string(sentinel))
		if err := os.Chtimes(state, old, old); err != nil {
			t.Fatal(err)
		}
	}
	r := badconfigExec(t, bin, "run", "-config", runPath)
	if _, why := badconfigMatch(c, runPath, r); why != "" {
		return fmt.Sprintf("fieldgate run: %s\n%s", why, r.stderr)
	}
	fi, err := os.Stat(state)
	switch {
	case !existing && err == nil:
		return "fieldgate run created the state file " + state
	case !existing && errors.Is(err, fs.ErrNotExist):
		return ""
	case err != nil:
		return err.Error()
	}
	if b, err := os.ReadFile(state); err != nil || !bytes.Equal(b, sentinel) || !fi.ModTime().Equal(old) {
		return fmt.Sprintf("fieldgate run changed the state file (modified %s, read error %v)", fi.ModTime(), err)
	}
	return ""
}

func badconfigWrite(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func badconfigMkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
}

// badconfigCert writes a self-signed certificate and its key, as
// server.pem and server.key, into dir: a listener that loads them goes on
// to its other files.
func badconfigCert(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fieldgate"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	badconfigWrite(t, filepath.Join(dir, "server.pem"), string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	badconfigWrite(t, filepath.Join(dir, "server.key"), string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
}

// badconfigPlaced reports whether a run error names the file at the line
// where the key's last part is written in text, followed by the key path
// ending in key.
func badconfigPlaced(logged, path, text, key string) bool {
	last := key[strings.LastIndexByte(key, '.')+1:]
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, last+":") {
			at := fmt.Sprintf("%s:%d: ", path, i+1)
			_, rest, ok := strings.Cut(logged, at)
			if !ok {
				return false
			}
			name, _, _ := strings.Cut(rest, ": ")
			return strings.HasSuffix(name, key)
		}
	}
	return false
}
