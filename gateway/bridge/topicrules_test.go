package bridge

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/internal/testkit"
	"github.com/fieldgate/fieldgate/internal/testkit/mosquitto"
)

// TestTopicRulesCheck: the configuration check takes the presets and
// their overrides, $ topics in routes, and refuses bad rules and routes
// whose every topic would break them, naming the key.
func TestTopicRulesCheck(t *testing.T) {
	const head = "bridges:\n  - name: c\n    address: a:1\n"
	for _, tc := range []struct {
		name, yaml string
		path, want string // "" when the file must pass
	}{
		{"aws-iot and shadow topics",
			"    topic_rules: {preset: aws-iot}\n    out:\n      - {filter: \"$aws/things/{device}/shadow/#\"}\n      - {filter: \"fieldgate/{device}/shadow\", topic: \"$aws/things/{device}/shadow/update\"}\n      - {filter: \"rules/#\", topic: \"$aws/rules/ingest/a/b/c/d/e/f/g/{2}\"}\n", "", ""},
		{"azure-iot-hub and $iothub",
			"    topic_rules: {preset: azure-iot-hub}\n    out:\n      - {filter: \"$iothub/#\"}\n      - {filter: \"fieldgate/#\", topic: \"devices/{device}/messages/events/\"}\n", "", ""},
		{"nats with an override", "    topic_rules: {preset: nats, max_bytes: 100}\n    out:\n      - {filter: \"#\"}\n", "", ""},
		{"rules without a preset", "    topic_rules: {max_bytes: 128, max_levels: 4, forbidden_chars: \" \", allow: [\"a/#\", \"$x/+\"]}\n    out:\n      - {filter: \"#\"}\n", "", ""},
		{"unknown preset", "    topic_rules: {preset: aws}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.preset", `"aws" is not a preset; use one of aws-iot, azure-iot-hub, nats`},
		{"negative max_bytes", "    topic_rules: {max_bytes: -1}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.max_bytes", "-1 is out of range; use 0 to 65535"},
		{"max_levels too high", "    topic_rules: {max_levels: 40000}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.max_levels", "40000 is out of range; use 0 to 32768"},
		{"uncounted_prefix with #", "    topic_rules: {uncounted_prefix: \"$aws/#\"}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.uncounted_prefix", `"$aws/#" is not a run of levels`},
		{"forbidden /", "    topic_rules: {forbidden_chars: \" /\"}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.forbidden_chars", "holds /, which separates levels"},
		{"bad allow filter", "    topic_rules: {allow: [\"a/#/b\"]}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.allow[0]", `"a/#/b" is not a valid topic filter`},
		{"shared allow filter", "    topic_rules: {allow: [\"$share/g/a\"]}\n    out:\n      - {filter: \"#\"}\n",
			"bridges[0].topic_rules.allow[0]", `"$share/g/a" is a shared subscription; write the filter after $share/{group}/`},
		{"a template too deep for AWS", "    topic_rules: {preset: aws-iot}\n    out:\n      - {filter: \"x/#\", topic: \"a/b/c/d/e/f/g/h/{topic}\"}\n",
			"bridges[0].out[0].topic", `every topic "a/b/c/d/e/f/g/h/{topic}" makes breaks topic_rules.max_levels (with its placeholders empty, 9 levels; the upstream takes at most 8)`},
		{"a template NATS cannot carry", "    topic_rules: {preset: nats}\n    out:\n      - {filter: \"x/#\", topic: \"site 7/{topic}\"}\n",
			"bridges[0].out[0].topic", "every topic \"site 7/{topic}\" makes breaks topic_rules.forbidden_chars"},
		{"an in-route into $SYS", "    in:\n      - {filter: \"$SYS/#\"}\n",
			"bridges[0].in[0].topic", `"{topic}" makes $SYS topics such as $SYS/x, which are the broker's own`},
		{"an in-route into $SYS by its template", "    in:\n      - {filter: \"cmd/+\", topic: \"$SYS/{2}\"}\n",
			"bridges[0].in[0].topic", `"$SYS/{2}" makes $SYS topics`},
		{"an in-route from $SYS elsewhere", "    in:\n      - {filter: \"$SYS/#\", topic: \"cloud/{topic}\"}\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ps := checkBridges(t, head+tc.yaml)
			switch {
			case tc.want == "" && len(ps) > 0:
				t.Errorf("problems %+v, want none", ps)
			case tc.want != "" && (len(ps) != 1 || ps[0].Path != tc.path || !strings.HasPrefix(ps[0].Msg, tc.want)):
				t.Errorf("problems %+v, want one at %s starting %q", ps, tc.path, tc.want)
			}
		})
	}
}

// TestTopicRules: what each preset and rule refuses, with the rule it
// names; AWS IoT's limits leave out the Basic Ingest prefix.
func TestTopicRules(t *testing.T) {
	levels := func(n int) string { return strings.TrimSuffix(strings.Repeat("l/", n), "/") }
	for _, tc := range []struct {
		rules TopicRules
		topic string
		rule  string // "" when taken
	}{
		{TopicRules{Preset: "aws-iot"}, strings.Repeat("x", 256), ""},
		{TopicRules{Preset: "aws-iot"}, strings.Repeat("x", 257), "max_bytes"},
		{TopicRules{Preset: "aws-iot"}, levels(8), ""},
		{TopicRules{Preset: "aws-iot"}, levels(9), "max_levels"},
		{TopicRules{Preset: "aws-iot"}, "$aws/things/gw-1/shadow/name/cfg/update/accepted", ""}, // 7 slashes
		{TopicRules{Preset: "aws-iot"}, "$aws/rules/ingest/" + levels(8), ""},
		{TopicRules{Preset: "aws-iot"}, "$aws/rules/ingest/" + levels(9), "max_levels"},
		{TopicRules{Preset: "aws-iot"}, "$aws/rules/ingest/" + strings.Repeat("x", 256), ""},
		{TopicRules{Preset: "aws-iot"}, "$aws/rules/ingest/" + strings.Repeat("x", 257), "max_bytes"},
		{TopicRules{Preset: "aws-iot"}, "$aws/things/" + strings.Repeat("x", 250), "max_bytes"}, // only rules/ is left out
		{TopicRules{Preset: "aws-iot", MaxBytes: 10}, "aaaaa/bbbbb", "max_bytes"},
		{TopicRules{Preset: "nats"}, "fieldgate/gw000/bad topic", "forbidden_chars"},
		{TopicRules{Preset: "nats"}, "a\tb", "forbidden_chars"},
		{TopicRules{Preset: "nats"}, "a\x7fb", "forbidden_chars"},
		{TopicRules{Preset: "nats"}, "spBv1.0/plant1//x/", ""},
		{TopicRules{Preset: "azure-iot-hub"}, "devices/gw-1/messages/events/", ""},
		{TopicRules{Preset: "azure-iot-hub"}, "devices/gw-1/messages/events/$.ct=application%2Fjson&$.ce=utf-8", ""},
		{TopicRules{Preset: "azure-iot-hub"}, "devices/gw-1/modules/m1/messages/events/", ""},
		{TopicRules{Preset: "azure-iot-hub"}, "$iothub/twin/PATCH/properties/reported/?$rid=4", ""},
		{TopicRules{Preset: "azure-iot-hub"}, "$iothub/twin/res/200/?$rid=4", "allow"},
		{TopicRules{Preset: "azure-iot-hub"}, "fieldgate/gw-1/climate/temperature", "allow"},
		{TopicRules{Preset: "azure-iot-hub", Allow: []string{}}, "fieldgate/gw-1/climate/temperature", ""}, // [] clears the preset's
		{TopicRules{ForbiddenChars: "é"}, "caf/é", "forbidden_chars"},
		{TopicRules{MaxLevels: 1, UncountedPrefix: "site/+"}, "site/7/a", ""},
		{TopicRules{MaxLevels: 1, UncountedPrefix: "site/+"}, "site/7", "max_levels"}, // nothing after the prefix: all counted
		{TopicRules{}, strings.Repeat("x/", 1000), ""},
	} {
		err := tc.rules.compile().check(tc.topic)
		got := ""
		if err != nil {
			got = err.Rule
			if !errors.Is(err, ErrTopicRules) || !strings.Contains(err.Error(), "topic_rules."+err.Rule) {
				t.Errorf("%+v on %.40q: error %v does not name its rule or wrap ErrTopicRules", tc.rules, tc.topic, err)
			}
		}
		if got != tc.rule {
			t.Errorf("%+v on %.40q: broke %q (%v), want %q", tc.rules, tc.topic, got, err, tc.rule)
		}
	}
	if (TopicRules{}).compile() != nil || (TopicRules{Preset: "nats"}).compile() == nil {
		t.Error("compile: want nil for no rules and the preset's rules for a preset")
	}
}

// TestRefusalLog: a topic is logged at most once a minute, all topics
// together at most refusalLines times a minute, and the next line says
// how many were not.
func TestRefusalLog(t *testing.T) {
	var l refusalLog
	t0 := time.Unix(1e9, 0)
	if ok, _ := l.allow("a", t0); !ok {
		t.Fatal("the first refusal was not logged")
	}
	if ok, _ := l.allow("a", t0.Add(59*time.Second)); ok {
		t.Error("the same topic was logged twice within a minute")
	}
	if ok, n := l.allow("a", t0.Add(61*time.Second)); !ok || n != 1 {
		t.Errorf("a minute later: logged %v with %d unlogged, want true and 1", ok, n)
	}
	t1 := t0.Add(10 * time.Minute)
	logged := 0
	for i := range 1000 {
		if ok, _ := l.allow(fmt.Sprintf("hostile/%d", i), t1); ok {
			logged++
		}
	}
	if logged != refusalLines {
		t.Errorf("%d lines for 1000 topics within a minute, want %d", logged, refusalLines)
	}
	if ok, n := l.allow("hostile/new", t1.Add(time.Minute)); !ok || n != 1000-refusalLines {
		t.Errorf("the next minute: logged %v with %d unlogged, want true and %d", ok, n, 1000-refusalLines)
	}
	if len(l.last) > 2*refusalLines {
		t.Errorf("%d topics remembered, want at most %d", len(l.last), 2*refusalLines)
	}
}

// TestOfferRefusesByTopicRules: Offer refuses a topic the rules forbid
// with the rule it breaks, counts it, queues nothing of it, logs it once
// a minute, and still queues what another route makes of it.
func TestOfferRefusesByTopicRules(t *testing.T) {
	var buf testkit.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	cfg := parseBridge(t, "bridges:\n  - name: cloud\n    address: 127.0.0.1:1\n    topic_rules: {max_levels: 3}\n"+
		"    out:\n      - {filter: \"fieldgate/#\", qos: 0, memory_only: true}\n      - {filter: \"fieldgate/#\", topic: \"all/{3}\", qos: 0, memory_only: true}\n")
	b, err := New(cfg, Options{Device: "gw1", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		err := b.Offer("fieldgate/gw1/a/b", []byte("x"), false, "dev", nil)
		var e *TopicRuleError
		if !errors.As(err, &e) || e.Rule != "max_levels" || e.Topic != "fieldgate/gw1/a/b" {
			t.Fatalf("Offer: %v, want a max_levels *TopicRuleError", err)
		}
	}
	if err := b.Offer("fieldgate/gw1/c", []byte("y"), false, "dev", nil); err != nil {
		t.Errorf("Offer of a good topic: %v", err)
	}
	if st := b.Stats(); st.Dropped[DropTopicRules] != 3 {
		t.Errorf("dropped %v, want 3 for topic_rules", st.Dropped)
	}
	var queued []string
	for _, m := range b.ob.takeMemory() {
		queued = append(queued, m.topic)
	}
	if want := []string{"all/a", "all/a", "all/a", "fieldgate/gw1/c", "all/c"}; strings.Join(queued, ",") != strings.Join(want, ",") {
		t.Errorf("queued %q, want %q: nothing from the refusing route, all from the other", queued, want)
	}
	text := buf.String()
	if n := strings.Count(text, "breaks the upstream's topic rules"); n != 1 {
		t.Errorf("%d log lines for three refusals of one topic within a minute, want 1:\n%s", n, text)
	}
	for _, want := range []string{"topic=fieldgate/gw1/a/b", "rule=topic_rules.max_levels", "route=0", `why="4 levels; the upstream takes at most 3"`} {
		if !strings.Contains(text, want) {
			t.Errorf("the log line lacks %s:\n%s", want, text)
		}
	}
}

// TestDollarTopicsUpstream: out-routes carry $aws and $iothub topics to a
// real upstream, retained when published so, from a local filter that
// names them or a template that makes them; an out-route on # does not
// carry them [MQTT-4.7.2-1].
func TestDollarTopicsUpstream(t *testing.T) {
	up := mosquitto.Start(t, mosquitto.Config{})
	shadow := watch(t, up.Addr(), "shadow", "$aws/#", false)
	twin := watch(t, up.Addr(), "twin", "$iothub/#", false)
	all := watch(t, up.Addr(), "all", "all/#", false)
	s := newSite(t, bridgeYAML(up.Addr(), `    topic_rules: {preset: aws-iot}
    out:
      - {filter: "$aws/things/{device}/shadow/#"}
      - {filter: "fieldgate/{device}/shadow", topic: "$aws/things/{device}/shadow/update"}
      - {filter: "$iothub/#"}
      - {filter: "#", topic: "all/{topic}"}
`), "")
	waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
	for _, m := range []struct{ topic, payload string }{
		{"$aws/things/gw1/shadow/update", `{"state":{"reported":{"fw":"1.2"}}}`},
		{"fieldgate/gw1/shadow", `{"state":{"reported":{"temp":21.5}}}`},
		{"$iothub/twin/PATCH/properties/reported/?$rid=7", `{"fw":"1.2"}`},
		{"plain/end", "sentinel"},
	} {
		if err := s.publish(m.topic, m.payload); err != nil {
			t.Fatalf("publish %s: %v", m.topic, err)
		}
	}
	if err := s.pub.Publish(t.Context(), "$aws/things/gw1/shadow/name/cfg/update", []byte(`{"v":1}`), 1, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shadow updates upstream", func() bool {
		return shadow.count("$aws/things/gw1/shadow/update") == 2 && shadow.count("$aws/things/gw1/shadow/name/cfg/update") == 1
	})
	waitFor(t, "the twin update upstream", func() bool { return twin.count("$iothub/twin/PATCH/properties/reported/?$rid=7") == 1 })
	waitFor(t, "the sentinel upstream", func() bool { return all.count("all/plain/end") == 1 })
	waitFor(t, "the outbox to empty", func() bool { return s.br.Stats().Depth == 0 })
	for topic := range all.topics() {
		if strings.HasPrefix(topic, "all/$") {
			t.Errorf("the route on # carried %s upstream", topic)
		}
	}
	// The retained shadow document stays upstream for a late subscriber.
	late := watch(t, up.Addr(), "late", "$aws/things/+/shadow/name/+/update", false)
	waitFor(t, "the retained shadow document", func() bool { return late.count("$aws/things/gw1/shadow/name/cfg/update") == 1 })
}

// TestTopicRulesAtTheRoute: against a real upstream, a topic the
// upstream's rules forbid is refused at the route (the local publisher
// told, a local subscriber served, nothing queued or sent, the drop
// counted), and what follows flows.
func TestTopicRulesAtTheRoute(t *testing.T) {
	for _, tc := range []struct {
		preset, bad, good string
	}{
		{"nats", "fieldgate/gw1/bad topic", "fieldgate/gw1/good"},
		{"aws-iot", "fieldgate/gw1/a/b/c/d/e/f/g", "fieldgate/gw1/a/b/c/d/e/f"},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			up := mosquitto.Start(t, mosquitto.Config{})
			w := watch(t, up.Addr(), "watcher", "#", false)
			s := newSite(t, bridgeYAML(up.Addr(), fmt.Sprintf("    topic_rules: {preset: %s}\n    out:\n      - {filter: \"fieldgate/#\"}\n", tc.preset)), "")
			waitFor(t, "the link", func() bool { return s.br.Stats().State == StateConnected })
			app, err := s.b.Connect("local-app")
			if err != nil {
				t.Fatal(err)
			}
			defer app.Close()
			got := make(chan string, 4)
			if err := app.Subscribe(tc.bad, 1, func(m broker.Message) { got <- m.Topic }); err != nil {
				t.Fatal(err)
			}
			if err := s.publish(tc.bad, "x"); !errors.Is(err, broker.ErrTopicRefused) {
				t.Errorf("publish %q: %v, want broker.ErrTopicRefused", tc.bad, err)
			}
			if g := <-got; g != tc.bad {
				t.Errorf("local subscriber got %q, want %q", g, tc.bad)
			}
			if err := s.publish(tc.good, "y"); err != nil {
				t.Fatalf("publish %q: %v", tc.good, err)
			}
			waitFor(t, "the good topic upstream", func() bool { return w.count(tc.good) == 1 })
			waitFor(t, "the outbox to empty", func() bool { return s.br.Stats().Depth == 0 })
			if st := s.br.Stats(); st.Dropped[DropTopicRules] != 1 {
				t.Errorf("stats %+v: want one topic_rules drop", st)
			}
			if n := w.count(tc.bad); n != 0 {
				t.Errorf("the upstream got %s %d times, want never", tc.bad, n)
			}
		})
	}
}
