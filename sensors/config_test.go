package sensors

import (
	"testing"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/internal/testkit/configtest"
)

// decodeConfig decodes doc, YAML with the gateway:, sensors: and outputs:
// sections, as the configuration file would (gateway/config, which
// imports this package, cannot serve its tests); it does not check it.
func decodeConfig(t testing.TB, doc string) Config {
	t.Helper()
	file := struct {
		Gateway Gateway  `yaml:"gateway"`
		Sensors []Sensor `yaml:"sensors"`
		Outputs []Output `yaml:"outputs"`
	}{Gateway: DefaultGateway()}
	configtest.Decode(t, doc, &file)
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
