package config_test

import (
	"bytes"
	"errors"
	"os"
	"slices"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/config"
)

// fuzzFile is the file name Parse is given: every problem must name it.
const fuzzFile = "fuzz.yaml"

// FuzzParse feeds arbitrary text to the configuration loader. It must not
// panic, and must either return a Config that validates or an *Error
// whose every problem names the file and a line of it, in file order; the
// same text must give the same answer twice.
//
//	go test -run '^$' -fuzz FuzzParse -fuzztime 15s ./gateway/config
func FuzzParse(f *testing.F) {
	f.Add(config.Embedded())
	if b, err := os.ReadFile("../../image/fieldgate-default.yaml"); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"",
		"~\n",
		"log:\n  level: debug\n",
		"log: [debug\n",
		"log: {}\n---\nlog: {}\n",
		"log:\n  level: debug\n  level: info\n",
		"broker:\n  max_keepalive: 60\n  acl:\n    - {user: '*', topic: \"sensors/%u/#\", access: readwrite}\n    - {topic: \"x/#/y\", access: all}\n",
		"listeners:\n  - {name: a, type: tcp, address: ':1883'}\n  - {name: b, type: ws, address: '127.0.0.1:1883'}\n",
		"listeners:\n  - name: secure\n    type: wss\n    address: ':8443'\n    tls:\n      cert: c.pem\n",
		"sensors:\n  - {name: t, kind: bme280, bus: sim, address: '0x76', interval: 1s, options: {oversampling: 16x, filter: x4}}\n",
		"sensors:\n  - name: tank\n    kind: ads1115\n    bus: \"1\"\n    interval: 5s\n    channels:\n      - {name: p, input: A0, from: [0.4, 2], to: [0, 10], range: [-1, 11], decimals: 2}\n",
		"sensors:\n  - {name: w, kind: ds18b20, bus: w1, address: 28-000005e2fdc3, interval: 30s}\n  - {name: d, kind: gpio_in, bus: sim, address: SIM_IN0, interval: 1m, options: {mode: counter, debounce: 5ms}}\n",
		"outputs:\n  - {name: pump, bus: sim, pin: SIM_OUT0, safe_state: 'off'}\n",
		"bridges:\n  - name: cloud\n    address: mqtt.example.com:8883\n    tls: {enabled: true}\n    out:\n      - {filter: \"fieldgate/{device}/#\", topic: \"sites/{device}/{3}/{4}\"}\n    in:\n      - {filter: \"commands/{device}/#\", topic: \"fieldgate/{device}/{3}/set\"}\n",
		"a: &x [*x]\n",
		"sensors: &s\n  - name: t\n    options: *s\n",
		"log:\n  level: \xff\n",
		"log:\n\tlevel: debug\n",
		"gateway: {name: \"a b\", topic_prefix: \"x/+\"}\n",
		"storage:\n  max_queued_bytes: 9223372036854775808\n",
		"\r00", // a line ends at a lone \r too
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(fuzzFile, data)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v: want exactly one", cfg != nil, err)
		}
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("Parse accepted a configuration that Validate refuses: %v", verr)
			}
			return
		}
		var cerr *config.Error
		if !errors.As(err, &cerr) || !errors.Is(err, config.ErrInvalid) {
			t.Fatalf("error %v (%T) is not a *config.Error", err, err)
		}
		if len(cerr.Problems) == 0 {
			t.Fatal("an *Error with no problems")
		}
		lines := fuzzLines(data)
		for _, p := range cerr.Problems {
			if p.File != fuzzFile || p.Line < 1 || p.Line > lines || p.Msg == "" {
				t.Fatalf("problem %q names file %q line %d of %d: want %s and a line of it, with a message", p, p.File, p.Line, lines, fuzzFile)
			}
		}
		if !slices.IsSortedFunc(cerr.Problems, func(a, b config.Problem) int { return a.Line - b.Line }) {
			t.Fatalf("problems out of file order: %v", err)
		}
		if _, again := config.Parse(fuzzFile, data); again == nil || again.Error() != err.Error() {
			t.Fatalf("the same text gave %v, then %v", err, again)
		}
	})
}

// fuzzLines counts the lines of data as YAML does: a line ends at \n,
// \r\n, \r, or (in UTF-8 text) U+0085, U+2028 and U+2029.
func fuzzLines(data []byte) int {
	n := 1 + bytes.Count(data, []byte("\n")) + bytes.Count(data, []byte("\r")) - bytes.Count(data, []byte("\r\n"))
	for _, brk := range []string{"\u0085", "\u2028", "\u2029"} {
		n += bytes.Count(data, []byte(brk))
	}
	return n
}
