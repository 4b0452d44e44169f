package bridge

import (
	"testing"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
)

func TestTemplates(t *testing.T) {
	for _, tc := range []struct {
		tpl, source, want string
		ok                bool
	}{
		{"{topic}", "fieldgate/gw1/climate/temperature", "fieldgate/gw1/climate/temperature", true},
		{"sites/{device}/{topic}", "a/b", "sites/gw1/a/b", true},
		{"sites/{device}/{3}/{4}", "fieldgate/gw1/climate/temperature", "sites/gw1/climate/temperature", true},
		{"x/{2}", "one", "", false},       // no second level
		{"{1}", "a/b", "a", true},         // first level only
		{"cmd/{2}", "a//c", "cmd/", true}, // an empty level is a level
		{"{topic}/{9}", "a/b", "", false}, // missing level
		{"plain/topic", "a/b", "plain/topic", true},
	} {
		tp, err := compileTemplate(tc.tpl, "gw1")
		if err != nil {
			t.Fatalf("compile %q: %v", tc.tpl, err)
		}
		got, ok := tp.render(tc.source)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%q on %q = %q, %v; want %q, %v", tc.tpl, tc.source, got, ok, tc.want, tc.ok)
		}
	}
	for _, bad := range []string{"{nope}", "a/{", "{0}", "{100}"} {
		if _, err := compileTemplate(bad, "gw1"); err == nil {
			t.Errorf("compileTemplate(%q) accepted", bad)
		}
	}
}

func TestOverlap(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"devices/+/telemetry", "devices/#", true},
		{"devices/+/telemetry", "devices/dev42/telemetry", true},
		{"devices/+/telemetry", "devices/+/status", false},
		{"a/#", "a", true}, // # matches its parent level
		{"a/+", "a", false},
		{"a/b", "a/b/c", false},
		{"+/+", "a/b", true},
		{"#", "anything/at/all", true},
		{"a/b/#", "a/c/#", false},
		// A server never sends a '$' topic for a filter beginning with a
		// wildcard [MQTT-4.7.2-1].
		{"#", "$SYS/#", false},
		{"+/broker/#", "$SYS/broker/uptime", false},
		{"$SYS/#", "$SYS/broker/+", true},
		// Their only common topic would be the empty one, which is none.
		{"+", "/#", false},
		// A shared subscription receives by the filter after its group.
		{"$share/g/cmd/#", "cmd/+/relay", true},
		{"$share/g/cmd/#", "$share/h/cmd/gw1/#", true},
		{"$share/g/cmd/#", "#", true},
		{"$share/g/cmd/#", "ota/#", false},
	} {
		if got := overlap(tc.a, tc.b); got != tc.want {
			t.Errorf("overlap(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := overlap(tc.b, tc.a); got != tc.want {
			t.Errorf("overlap(%q, %q) = %v, want %v (not symmetric)", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestSubscriptionIdentifiersAreStableAndOnlyForOverlaps(t *testing.T) {
	c := Config{Name: "cloud", In: []InRoute{
		{Filter: "cmd/{device}/#", Topic: "{topic}", QoS: 1},
		{Filter: "cmd/+/relay", Topic: "{topic}", QoS: 1},
		{Filter: "ota/{device}", Topic: "{topic}", QoS: 1},
	}}
	_, ins, err := compileRoutes(c, "gw1")
	if err != nil {
		t.Fatal(err)
	}
	if ins[0].filter != "cmd/gw1/#" {
		t.Errorf("filter = %q, want {device} replaced", ins[0].filter)
	}
	if ins[0].subID == 0 || ins[1].subID == 0 || ins[0].subID == ins[1].subID {
		t.Errorf("overlapping filters got identifiers %d and %d, want two distinct ones", ins[0].subID, ins[1].subID)
	}
	if ins[2].subID != 0 {
		t.Errorf("a filter overlapping nothing got identifier %d, want none", ins[2].subID)
	}
	for _, r := range ins[:2] {
		if r.subID < 1 || r.subID > mqttwire.MaxSubscriptionID {
			t.Errorf("identifier %d out of MQTT's range", r.subID)
		}
	}
	// The same configuration gives the same identifiers after a restart,
	// so a resumed upstream session still matches.
	_, again, _ := compileRoutes(c, "gw1")
	if again[0].subID != ins[0].subID || again[1].subID != ins[1].subID {
		t.Errorf("identifiers changed between two compilations: %d,%d then %d,%d", ins[0].subID, ins[1].subID, again[0].subID, again[1].subID)
	}
	// A collision takes the next candidate, deterministically.
	taken := map[int]bool{subIDFor("x/#", nil): true}
	if id := subIDFor("x/#", taken); taken[id] || id == 0 {
		t.Errorf("subIDFor with the first candidate taken = %d", id)
	}
	a, b := overlapping(ins)
	if a == nil || a.index != 0 || b.index != 1 {
		t.Errorf("overlapping = %v, %v; want in[0] and in[1]", a, b)
	}
}

// TestSubscriptionIdentifiersFollowMQTTMatching checks that in-routes the
// server can tell apart by filter alone get no identifiers and no overlap
// error, and that a shared in-route gets one when its filter overlaps
// another route's.
func TestSubscriptionIdentifiersFollowMQTTMatching(t *testing.T) {
	c := Config{Name: "cloud", In: []InRoute{
		{Filter: "#", Topic: "cloud/{topic}", QoS: 1},
		{Filter: "$SYS/broker/#", Topic: "cloud/sys/{3}", QoS: 0},
	}}
	_, ins, err := compileRoutes(c, "gw1")
	if err != nil {
		t.Fatal(err)
	}
	if ins[0].subID != 0 || ins[1].subID != 0 {
		t.Errorf("# and $SYS/broker/# got identifiers %d and %d, want none: # never receives a $ topic", ins[0].subID, ins[1].subID)
	}
	if a, b := overlapping(ins); a != nil {
		t.Errorf("overlapping = in[%d], in[%d]; want none, so that an MQTT 3.1.1 bridge may have both", a.index, b.index)
	}

	c.In = []InRoute{
		{Filter: "$share/gateways/cmd/{device}/#", Topic: "{topic}", QoS: 1},
		{Filter: "cmd/+/relay", Topic: "{topic}", QoS: 1},
	}
	_, ins, err = compileRoutes(c, "gw1")
	if err != nil {
		t.Fatal(err)
	}
	if ins[0].subID == 0 || ins[1].subID == 0 {
		t.Errorf("a shared in-route and one its filter overlaps got identifiers %d and %d, want two", ins[0].subID, ins[1].subID)
	}
}
