package bridge

import (
	"bytes"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fieldgate/fieldgate/internal/check"
)

// The configuration file (gateway/config) decodes the bridges: list, and
// it imports this package, so these tests cannot use it. parseBridge reads
// the YAML the tests write as the file would: every bridge and route is
// filled with its defaults before its keys are decoded (the UnmarshalYAML
// methods below, which exist only in the tests), an unknown key is an
// error, and the result is checked.

// parseBridge decodes doc, a bridges: list, checks it, and returns its
// first bridge.
func parseBridge(t testing.TB, doc string) Config {
	t.Helper()
	var file struct {
		Bridges []Config `yaml:"bridges"`
	}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("decoding the bridges: %v", err)
	}
	k := check.New(nil, false)
	Check(k, file.Bridges)
	if ps := k.Problems(); len(ps) > 0 {
		t.Fatalf("the bridges do not pass their check: %+v", ps)
	}
	return file.Bridges[0]
}

// decodeStrict decodes n into v, refusing keys v does not have (which
// Node.Decode alone would ignore).
func decodeStrict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// UnmarshalYAML decodes a bridge of the tests' YAML over its defaults.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	c.SetDefaults()
	type plain Config
	return decodeStrict(n, (*plain)(c))
}

// UnmarshalYAML decodes an out-route of the tests' YAML over its defaults.
func (r *OutRoute) UnmarshalYAML(n *yaml.Node) error {
	r.SetDefaults()
	type plain OutRoute
	return decodeStrict(n, (*plain)(r))
}

// UnmarshalYAML decodes an in-route of the tests' YAML over its defaults.
func (r *InRoute) UnmarshalYAML(n *yaml.Node) error {
	r.SetDefaults()
	type plain InRoute
	return decodeStrict(n, (*plain)(r))
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
