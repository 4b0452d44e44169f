package bridge

import (
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/internal/testkit/configtest"
)

// parseBridge decodes doc, a bridges: list, as the configuration file
// would (gateway/config, which imports this package, cannot serve its
// tests), checks it, and returns its first bridge.
func parseBridge(t testing.TB, doc string) Config {
	t.Helper()
	bridges, ps := checkBridges(t, doc)
	if len(ps) > 0 {
		t.Fatalf("the bridges do not pass their check: %+v", ps)
	}
	return bridges[0]
}

// checkBridges decodes doc, a bridges: list, and returns the bridges and
// the problems their check reports.
func checkBridges(t testing.TB, doc string) ([]Config, []check.Problem) {
	t.Helper()
	var file struct {
		Bridges []Config `yaml:"bridges"`
	}
	configtest.Decode(t, doc, &file)
	k := check.New(nil, false)
	Check(k, file.Bridges)
	return file.Bridges, k.Problems()
}

// TestTemplateRulesAreTheCompilers: the configuration check refuses
// exactly the templates the routes cannot compile, with the file's words.
func TestTemplateRulesAreTheCompilers(t *testing.T) {
	for _, tc := range []struct{ tpl, want string }{
		{"a/{99}", ""},
		{"a/{100}", `"a/{100}" has an unknown placeholder {100}; use {topic}, {device} or a level number such as {2}`},
		{"a/{0}", `"a/{0}" has an unknown placeholder {0}`},
		{"a/{", `"a/{" has a { without its }`},
		{"a/+/{topic}", `"a/+/{topic}" does not make a valid topic`},
		{"", "required: a topic template such as site-7/{topic}"},
	} {
		k := check.New(nil, false)
		checkTemplate(k, "t", tc.tpl)
		ps := k.Problems()
		_, err := compileTemplate(tc.tpl, "gw1")
		switch {
		case tc.want == "" && (len(ps) > 0 || err != nil):
			t.Errorf("template %q: problems %+v, compile error %v; want neither", tc.tpl, ps, err)
		case tc.want != "" && (len(ps) != 1 || !strings.HasPrefix(ps[0].Msg, tc.want)):
			t.Errorf("template %q: problems %+v, want one starting %q", tc.tpl, ps, tc.want)
		}
	}
}

// TestDeadLetterAfterRange: dead_letter_after is 0 (never) or 2 to 100;
// 1 would move a message aside on a failure no probe confirmed.
func TestDeadLetterAfterRange(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, true}, {1, false}, {2, true}, {3, true}, {100, true}, {101, false}, {-1, false}} {
		cfg := parseBridge(t, "bridges:\n  - name: cloud\n    address: mqtt.example.com:8883\n    out:\n      - {filter: \"a/#\"}\n")
		if cfg.DeadLetterAfter != 3 {
			t.Fatalf("dead_letter_after defaults to %d, want 3", cfg.DeadLetterAfter)
		}
		cfg.DeadLetterAfter = tc.n
		k := check.New(nil, false)
		Check(k, []Config{cfg})
		ps := k.Problems()
		switch {
		case tc.ok && len(ps) > 0:
			t.Errorf("dead_letter_after %d: %+v, want no problem", tc.n, ps)
		case !tc.ok && (len(ps) != 1 || ps[0].Path != "bridges[0].dead_letter_after" || !strings.Contains(ps[0].Msg, "use 2 to 100")):
			t.Errorf("dead_letter_after %d: %+v, want one problem naming the key and the range", tc.n, ps)
		}
	}
}
