package sensors

import (
	"bytes"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fieldgate/fieldgate/internal/check"
)

// The configuration file (gateway/config) decodes the gateway:, sensors:
// and outputs: sections, and it imports this package, so these tests
// cannot use it. decodeConfig reads the YAML the tests write as the file
// would: the gateway section starts from its defaults, every sensor,
// channel and output is filled with its defaults before its keys are
// decoded (the UnmarshalYAML methods below, which exist only in the
// tests), and an unknown key is an error.

// decodeConfig decodes doc without checking it.
func decodeConfig(t testing.TB, doc string) Config {
	t.Helper()
	file := struct {
		Gateway Gateway  `yaml:"gateway"`
		Sensors []Sensor `yaml:"sensors"`
		Outputs []Output `yaml:"outputs"`
	}{Gateway: DefaultGateway()}
	dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("decoding the sensors' sections: %v", err)
	}
	return Config{Gateway: file.Gateway, Sensors: file.Sensors, Outputs: file.Outputs}
}

// parseConfig decodes doc and checks it, as a configuration file is
// checked when it is loaded.
func parseConfig(t testing.TB, doc string) Config {
	t.Helper()
	cfg := decodeConfig(t, doc)
	k := check.New(nil, false)
	cfg.Check(k)
	if ps := k.Problems(); len(ps) > 0 {
		t.Fatalf("the sensors' sections do not pass their check: %+v", ps)
	}
	return cfg
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

// UnmarshalYAML decodes a sensor of the tests' YAML over its defaults.
func (s *Sensor) UnmarshalYAML(n *yaml.Node) error {
	s.SetDefaults()
	type plain Sensor
	return decodeStrict(n, (*plain)(s))
}

// UnmarshalYAML decodes a channel of the tests' YAML over its defaults.
func (c *Channel) UnmarshalYAML(n *yaml.Node) error {
	c.SetDefaults()
	type plain Channel
	return decodeStrict(n, (*plain)(c))
}

// UnmarshalYAML decodes an output of the tests' YAML over its defaults.
func (o *Output) UnmarshalYAML(n *yaml.Node) error {
	o.SetDefaults()
	type plain Output
	return decodeStrict(n, (*plain)(o))
}
