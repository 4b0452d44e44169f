// Package config composes fieldgate's configuration file: one YAML file
// whose sections belong to the parts they configure. Each part owns the
// types, defaults and check of its section (storage.Config; broker.Config
// and broker.Listener; ops.Config; the sensors' Gateway, Sensor and
// Output; bridge.Config); this package puts them together as Config, the
// file's schema, decodes a file with the line of every key, starts from
// each part's defaults, and runs each part's check. The log: section is
// its own.
//
// The contract: a key the schema does not know is an error, never silently
// ignored; and a broken file is reported whole, every problem at once, each
// naming the key path, the file and line, and what would be right. Parse
// and Load decode and validate; Validate can be run again on a Config
// changed in code. Nothing registers checks: Parse answers the same
// whatever else is linked in.
package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"

	"go.yaml.in/yaml/v3"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/gateway/ops"
	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/sensors"
	"github.com/fieldgate/fieldgate/storage"
)

// EmbeddedName is the file name used in messages about the embedded default configuration.
const EmbeddedName = "embedded:default.yaml"

//go:embed default.yaml
var embedded []byte

// Embedded returns the built-in configuration file: no hardware, loopback listeners only.
func Embedded() []byte {
	return bytes.Clone(embedded)
}

// Config is the whole configuration of one gateway.
type Config struct {
	Log       Log               `yaml:"log"`
	Storage   storage.Config    `yaml:"storage"`
	Broker    broker.Config     `yaml:"broker"`
	Listeners []broker.Listener `yaml:"listeners"`
	Ops       ops.Config        `yaml:"ops"`
	Gateway   sensors.Gateway   `yaml:"gateway"`
	Sensors   []sensors.Sensor  `yaml:"sensors"`
	Outputs   []sensors.Output  `yaml:"outputs"`
	Bridges   []bridge.Config   `yaml:"bridges"`

	// src remembers where each key was written so that Validate can point
	// at the line; it is empty for a Config built in code.
	src source
}

// Log configures the process logger.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn or error
	Format string `yaml:"format"` // text or json
}

// check reports the log section's problems to k.
func (l Log) check(k *check.Checker) {
	k.OneOf("log.level", l.Level, "debug", "info", "warn", "error")
	k.OneOf("log.format", l.Format, "text", "json")
}

// Default returns the configuration used for every key a file leaves out:
// each section's part's defaults (list items, such as a sensor, are
// filled with theirs as they are decoded), and the log's.
func Default() *Config {
	return &Config{
		Log:       Log{Level: "info", Format: "text"},
		Storage:   storage.DefaultConfig(),
		Broker:    broker.DefaultConfig(),
		Listeners: broker.DefaultListeners(),
		Ops:       ops.DefaultConfig(),
		Gateway:   sensors.DefaultGateway(),
	}
}

// SensorsConfig returns the sections the sensors' poller runs: gateway,
// sensors and outputs.
func (c *Config) SensorsConfig() sensors.Config {
	return sensors.Config{Gateway: c.Gateway, Sensors: c.Sensors, Outputs: c.Outputs}
}

// SlogLevel returns the slog level named by Level; unknown names give info.
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// Load reads, decodes and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: read %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse decodes data on top of Default and validates the result; name is the
// file name used in messages. Any problem yields a nil Config and an *Error.
func Parse(name string, data []byte) (*Config, error) {
	cfg := Default()
	d := decoder{file: name, lines: map[string]int{"": 1}}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF) || err == nil && isEmpty(&doc):
		// Almost always a mistake, such as a copy cut short, and never
		// a useful gateway: no sensors, and no way for a client to log in.
		d.fail("", 1, "the file has no settings; write the configuration in it (keys left out keep their defaults), or leave out -config to run the built-in configuration")
	case err != nil:
		return nil, newError([]Problem{syntaxProblem(name, data, err)})
	default:
		var extra yaml.Node
		switch err := dec.Decode(&extra); {
		case errors.Is(err, io.EOF):
		case err != nil:
			return nil, newError([]Problem{syntaxProblem(name, data, err)})
		default:
			d.fail("", extra.Line, "a second YAML document starts here; keep one document per file")
		}
		d.value("", doc.Content[0], reflect.ValueOf(cfg).Elem())
	}

	cfg.src = source{file: name, lines: d.lines}
	problems := d.problems
	for _, p := range cfg.problems() {
		// A value that could not be decoded would also fail validation;
		// report the decoding problem alone.
		if !d.covers(p.Path) {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return nil, newError(problems)
	}
	return cfg, nil
}

// isEmpty reports whether doc holds no value: only comments, or null.
func isEmpty(doc *yaml.Node) bool {
	return len(doc.Content) == 0 || doc.Content[0].Kind == yaml.ScalarNode && doc.Content[0].Tag == "!!null"
}
