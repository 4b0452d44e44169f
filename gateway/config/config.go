// Package config owns fieldgate's configuration: one YAML file decoded into
// one typed struct, Config.
//
// The contract: every default lives in Default; a key the schema does not
// know is an error, never silently ignored; and a broken file is reported
// whole, every problem at once, each naming the key path, the file and line,
// and what would be right. Parse and Load decode and validate; Validate can
// be run again on a Config changed in code.
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
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/gateway/ops"
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
	Gateway   Gateway           `yaml:"gateway"`
	Sensors   []Sensor          `yaml:"sensors"`
	Outputs   []Output          `yaml:"outputs"`
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

// Gateway names this gateway in the topics its sensors publish on.
type Gateway struct {
	// Name is the {device} level of fieldgate/{device}/{sensor}/{quantity};
	// empty means the host name, reduced to letters, digits, - and _.
	Name            string `yaml:"name"`
	TopicPrefix     string `yaml:"topic_prefix"`     // the first topic level of every reading
	Discovery       bool   `yaml:"discovery"`        // publish Home Assistant MQTT discovery configs
	DiscoveryPrefix string `yaml:"discovery_prefix"` // Home Assistant's discovery prefix
}

// Sensor is one device the gateway polls.
type Sensor struct {
	Name    string `yaml:"name"`    // becomes a topic level: fieldgate/{device}/{name}/...
	Kind    string `yaml:"kind"`    // the driver, such as bme280, sht3x or ads1115
	Bus     string `yaml:"bus"`     // where the device is wired: an I²C bus number, gpio, w1, or sim
	Address string `yaml:"address"` // its address on the bus: 0x76, a pin name such as GPIO17, a 1-Wire id

	Interval time.Duration `yaml:"interval"` // time between readings
	// Jitter moves each reading by up to this much either way (never more
	// than half the interval), so sensors sharing an interval do not all
	// wake together.
	Jitter  time.Duration `yaml:"jitter"`
	Timeout time.Duration `yaml:"timeout"` // how long one read may take before it counts as failed
	Retries int           `yaml:"retries"` // further attempts, with backoff, before a reading counts as failed
	// MaxBackoff caps the wait between attempts on a sensor that keeps
	// failing; a failing sensor is tried at its interval, doubling up to
	// this (or the interval, if that is longer).
	MaxBackoff time.Duration `yaml:"max_backoff"`
	QoS        int           `yaml:"qos"`    // of the published readings
	Retain     bool          `yaml:"retain"` // whether readings are retained

	// Options are the driver's own settings; each driver documents and
	// checks its keys.
	Options  map[string]string `yaml:"options"`
	Channels []Channel         `yaml:"channels"` // the inputs of a multi-channel converter such as the ADS1115
}

// SetDefaults fills a sensor written in a file before its keys are decoded.
func (s *Sensor) SetDefaults() {
	// One second spreads readings without making them irregular.
	s.Jitter = time.Second
	// Two seconds is ample for every supported device (a DS18B20 needs
	// 750 ms at 12 bits), and short enough to notice a stuck bus.
	s.Timeout = 2 * time.Second
	s.Retries = 2
	s.MaxBackoff = 5 * time.Minute
	s.QoS = 1
}

// Channel is one input of a multi-channel sensor, published as its own quantity.
type Channel struct {
	Name  string `yaml:"name"`  // the quantity: a topic level such as tank-pressure
	Input string `yaml:"input"` // the driver's input name, such as A0 or A0-A1
	Unit  string `yaml:"unit"`  // the unit after scaling, such as bar or V
	// From and To scale the measured value linearly: From[0] becomes To[0]
	// and From[1] becomes To[1]. A 4–20 mA transmitter across a 100 Ω
	// shunt reads 0.4–2.0 V: from [0.4, 2.0] to [0, 10] gives bar.
	From []float64 `yaml:"from"`
	To   []float64 `yaml:"to"`
	// Range is the plausible [low, high] of the scaled value; a reading
	// outside it is counted as implausible and not published.
	Range    []float64 `yaml:"range"`
	Decimals int       `yaml:"decimals"` // digits after the point in payloads
	Class    string    `yaml:"class"`    // Home Assistant device_class, such as pressure
}

// SetDefaults fills a channel written in a file before its keys are decoded.
func (c *Channel) SetDefaults() { c.Decimals = 3 }

// Output is a GPIO output, such as a relay, that follows commands.
type Output struct {
	Name      string `yaml:"name"`       // a topic level: commands arrive on fieldgate/{device}/{name}/set
	Bus       string `yaml:"bus"`        // gpio for the board's pins, or sim
	Pin       string `yaml:"pin"`        // the pin name, such as GPIO17
	ActiveLow bool   `yaml:"active_low"` // on drives the pin low, as most relay boards want
	// SafeState is applied at start, before any command, and on shutdown.
	SafeState string `yaml:"safe_state"`
	QoS       int    `yaml:"qos"` // of the command subscription and the state messages
}

// SetDefaults fills an output written in a file before its keys are decoded.
func (o *Output) SetDefaults() {
	o.SafeState = "off"
	o.QoS = 1
}

// Default returns the configuration used for every key a file leaves out.
// It is the one place defaults are written down.
func Default() *Config {
	return &Config{
		Log:       Log{Level: "info", Format: "text"},
		Storage:   storage.DefaultConfig(),
		Broker:    broker.DefaultConfig(),
		Listeners: broker.DefaultListeners(),
		Ops:       ops.DefaultConfig(),
		Gateway: Gateway{
			TopicPrefix:     "fieldgate",
			Discovery:       true,
			DiscoveryPrefix: "homeassistant",
		},
	}
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
