package config

import (
	"errors"
	"strings"
	"testing"
)

// What only a sensor's kind knows (its addresses, options and channels) is
// checked by the sensors package; these tests, moved here from it, check
// that Parse reports those problems with their file and line like the rest.

// TestADS1x15ConfigProblem checks that a bad input in a file is reported
// by Parse with its line, through the kind's Parse.
func TestADS1x15ConfigProblem(t *testing.T) {
	const adsDoc = `sensors:
  - name: analog
    kind: ads1115
    bus: "1"
    address: "0x48"
    interval: 10s
    channels:
      - {name: supply, input: A0}
      - {name: tank, input: A2-A3, unit: bar, from: [0.4, 2.0], to: [0, 10], decimals: 2, class: pressure}
`
	doc := strings.Replace(adsDoc, "input: A2-A3", "input: A4", 1)
	_, err := Parse("test.yaml", []byte(doc))
	var ce *Error
	if !errors.As(err, &ce) || len(ce.Problems) != 1 {
		t.Fatalf("err = %v; want one problem", err)
	}
	if p := ce.Problems[0]; p.Path != "sensors[0].channels[1].input" || p.Line != 9 || !strings.Contains(p.Msg, `"A4"`) {
		t.Errorf("problem = %+v; want channels[1].input on line 9", p)
	}
}

func TestGPIOInProblemLine(t *testing.T) {
	doc := "sensors:\n" +
		"  - name: door\n" +
		"    kind: gpio_in\n" +
		"    bus: gpio\n" +
		"    address: GPIO17\n" +
		"    interval: 1m\n" +
		"    options:\n" +
		"      debounce: 20s\n"
	_, err := Parse("site.yaml", []byte(doc))
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("config.Parse = %v; want a *config.Error", err)
	}
	if len(ce.Problems) != 1 {
		t.Fatalf("problems = %+v", ce.Problems)
	}
	p := ce.Problems[0]
	if p.File != "site.yaml" || p.Line != 8 || p.Path != "sensors[0].options.debounce" {
		t.Errorf("problem at %s:%d %s; want site.yaml:8 sensors[0].options.debounce", p.File, p.Line, p.Path)
	}
}

// TestSensorKindProblemsCarryTheirLine is the file's half of the sensors
// package's TestPollerRejectsBadSensorsBeforeStarting: an unknown option
// is named, on its line.
func TestSensorKindProblemsCarryTheirLine(t *testing.T) {
	_, err := Parse("t.yaml", []byte("sensors:\n  - {name: a, kind: gpio_in, bus: gpio, address: GPIO17, interval: 1s, options: {speed: fast}}\n"))
	if err == nil || !strings.Contains(err.Error(), "options.speed") || !strings.Contains(err.Error(), "unknown option") {
		t.Fatalf("err = %v, want the unknown option named", err)
	}
	var cerr *Error
	if !errors.As(err, &cerr) || cerr.Problems[0].Line != 2 {
		t.Errorf("err = %#v, want a config problem on line 2", err)
	}
}
