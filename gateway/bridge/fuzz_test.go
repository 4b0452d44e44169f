package bridge

import (
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/matcher"
)

// FuzzTemplate compiles a route's topic template and renders it. Whatever
// configuration validation accepts must compile; a topic rendered from a
// valid one is valid; {topic} alone renders the source unchanged; a
// template without placeholders renders itself; and a template that
// validation accepts renders whenever every level it names exists and is
// not empty, and the device name is one validation accepts.
//
//	go test -run '^$' -fuzz FuzzTemplate -fuzztime 15s ./gateway/bridge
func FuzzTemplate(f *testing.F) {
	for _, s := range [][3]string{
		{"{topic}", "gw1", "fieldgate/gw1/temp/value"},
		{"sites/{device}/{3}/{4}", "gw1", "fieldgate/gw1/temp/value"},
		{"fieldgate/{device}/{3}/set", "gw-1", "commands/gw-1/pump"},
		{"up/{topic}", "gw", "$SYS/x"},
		{"{1}", "gw", "/a"},
		{"{2}{1}", "gw", "a/b"},
		{"a/{99}", "gw", "a"},
		{"{0}", "gw", "a"},
		{"{+1}", "gw", "a"},
		{"{01}/x", "gw", "a"},
		{"{-1}", "gw", "a"},
		{"{99999999999999999999}", "gw", "a"},
		{"{topic", "gw", "a"},
		{"a/}{/b", "gw", "a"},
		{"{}", "gw", "a"},
		{"{device}", "", "a"},
		{"x/+/{topic}", "gw", "a"},
		{"#", "gw", "a"},
		{"a\x00{1}", "gw", "b"},
		{"{1}", "gw", "\xff"},
		{"{topic}", "gw", "#"}, // {topic} passes its source through unchecked: sources are topics
	} {
		f.Add(s[0], s[1], s[2])
	}
	if ps := fuzzCheck(fuzzBridge("{topic}")); len(ps) > 0 {
		f.Fatalf("the fuzz target's bridge configuration is not valid: %+v", ps)
	}
	f.Fuzz(func(t *testing.T, tmpl, device, source string) {
		tp, err := compileTemplate(tmpl, device)
		accepted := fuzzTemplateAccepted(t, tmpl)
		if accepted && err != nil {
			t.Fatalf("validation accepts template %q, compiling it fails: %v", tmpl, err)
		}
		if err != nil {
			return
		}
		out, ok := tp.render(source)
		// Sources are topics: the broker's, or checked by the client
		// when they come from the upstream.
		if ok && matcher.ValidateTopic(source) == nil && matcher.ValidateTopic(out) != nil {
			t.Fatalf("template %q rendered %q from %q: not a valid topic", tmpl, out, source)
		}
		if tmpl == "{topic}" && (!ok || out != source) {
			t.Fatalf("{topic} rendered %q, %v from %q", out, ok, source)
		}
		if !strings.ContainsAny(tmpl, "{}") {
			if want := matcher.ValidateTopic(tmpl) == nil; ok != want || ok && out != tmpl {
				t.Fatalf("literal template %q rendered %q, %v", tmpl, out, ok)
			}
		}
		if !accepted || ok || !fuzzDeviceName(device) ||
			matcher.ValidateTopic(source) != nil || len(tmpl)+len(device)+len(source)*strings.Count(tmpl, "{") > 0xFFFF {
			return
		}
		// The template is valid and so are the values: it renders
		// unless a level it names is missing or empty.
		levels := strings.Split(source, "/")
		for _, p := range tp.parts {
			if p.level > len(levels) || p.level > 0 && levels[p.level-1] == "" {
				return
			}
			if p.level == -1 && source == "" {
				return
			}
		}
		t.Fatalf("validation accepts template %q, yet it does not render from %q with device %q", tmpl, source, device)
	})
}

// fuzzDeviceName reports whether a gateway name validation would accept
// could be device: letters, digits, - and _ (what a topic level of the
// device needs: no wildcard, no separator).
func fuzzDeviceName(device string) bool {
	if device == "" {
		return false
	}
	for _, r := range device {
		if !(r == '-' || r == '_' || '0' <= r && r <= '9' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
			return false
		}
	}
	return true
}

// fuzzBridge returns a bridge, valid apart from its out-route's topic
// template, tmpl.
func fuzzBridge(tmpl string) Config {
	return Config{
		Name: "cloud", Address: "mqtt.example.com:8883", Protocol: "auto",
		KeepAlive: time.Minute, ReconnectMin: time.Second, ReconnectMax: time.Minute, AckTimeout: 30 * time.Second,
		MaxInflight: 32, MaxOutboxBytes: 64 << 20, MaxOutboxAge: 168 * time.Hour, MaxDeadLetterBytes: 8 << 20,
		Out: []OutRoute{{Filter: "fieldgate/#", Topic: tmpl, QoS: 1, Class: ClassTelemetry}},
	}
}

// fuzzCheck returns the problems the configuration check finds in b, as
// the bridges: list's only item.
func fuzzCheck(b Config) []check.Problem {
	k := check.New(nil, false)
	Check(k, []Config{b})
	return k.Problems()
}

// fuzzTemplateAccepted reports whether configuration validation accepts
// tmpl as an out-route's topic template.
func fuzzTemplateAccepted(t *testing.T, tmpl string) bool {
	ps := fuzzCheck(fuzzBridge(tmpl))
	if len(ps) == 0 {
		return true
	}
	for _, p := range ps {
		if p.Path != "bridges[0].out[0].topic" {
			t.Fatalf("template %q: validation found a problem elsewhere: %v", tmpl, p)
		}
	}
	return false
}
