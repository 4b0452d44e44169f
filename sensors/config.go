package sensors

import (
	"fmt"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/matcher"
)

// Config is what the poller runs: the gateway:, sensors: and outputs:
// sections of the configuration file.
type Config struct {
	Gateway Gateway
	Sensors []Sensor
	Outputs []Output
}

// Gateway is the gateway: section of the configuration file: it names
// this gateway in the topics its sensors publish on.
type Gateway struct {
	// Name is the {device} level of fieldgate/{device}/{sensor}/{quantity};
	// empty means the host name, reduced to letters, digits, - and _.
	Name            string `yaml:"name"`
	TopicPrefix     string `yaml:"topic_prefix"`     // the first topic level of every reading
	Discovery       bool   `yaml:"discovery"`        // publish Home Assistant MQTT discovery configs
	DiscoveryPrefix string `yaml:"discovery_prefix"` // Home Assistant's discovery prefix
}

// Sensor is one device the gateway polls: an item of the configuration
// file's sensors: list.
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

// SetDefaults fills a sensor with the values of the keys a file leaves
// out; the configuration file calls it before decoding an item's keys.
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

// SetDefaults fills a channel with the values of the keys a file leaves out.
func (c *Channel) SetDefaults() { c.Decimals = 3 }

// Output is a GPIO output, such as a relay, that follows commands: an
// item of the configuration file's outputs: list.
type Output struct {
	Name      string `yaml:"name"`       // a topic level: commands arrive on fieldgate/{device}/{name}/set
	Bus       string `yaml:"bus"`        // gpio for the board's pins, or sim
	Pin       string `yaml:"pin"`        // the pin name, such as GPIO17
	ActiveLow bool   `yaml:"active_low"` // on drives the pin low, as most relay boards want
	// SafeState is applied at start, before any command, and on shutdown.
	SafeState string `yaml:"safe_state"`
	QoS       int    `yaml:"qos"` // of the command subscription and the state messages
}

// SetDefaults fills an output with the values of the keys a file leaves out.
func (o *Output) SetDefaults() {
	o.SafeState = "off"
	o.QoS = 1
}

// DefaultGateway returns the gateway section a file leaves out.
func DefaultGateway() Gateway {
	return Gateway{
		TopicPrefix:     "fieldgate",
		Discovery:       true,
		DiscoveryPrefix: "homeassistant",
	}
}

// Check reports the problems of the three sections to k, under the keys
// gateway, sensors and outputs: the keys every sensor has, then what its
// kind makes of its address, options and channels.
func (c Config) Check(k *check.Checker) {
	checkGateway(k, c.Gateway)
	names := map[string]string{}
	for i, s := range c.Sensors {
		s.check(k, fmt.Sprintf("sensors[%d]", i), names)
	}
	for i, o := range c.Outputs {
		p := fmt.Sprintf("outputs[%d]", i)
		// Outputs share the topic level of sensors, so one namespace.
		k.Name(p+".name", o.Name, names)
		k.OneOf(p+".bus", o.Bus, "gpio", "sim")
		if o.Pin == "" {
			k.Fail(p+".pin", "required: the pin name, such as GPIO17")
		}
		k.OneOf(p+".safe_state", o.SafeState, "off", "on")
		k.IntRange(p+".qos", o.QoS, 0, 2, "1")
	}
	checkKinds(k, c.Sensors)
}

// checkGateway reports the problems of the gateway: section.
func checkGateway(k *check.Checker, g Gateway) {
	if g.Name != "" {
		k.Name("gateway.name", g.Name, map[string]string{})
	}
	for _, kv := range [...][2]string{{"gateway.topic_prefix", g.TopicPrefix}, {"gateway.discovery_prefix", g.DiscoveryPrefix}} {
		if kv[1] == "" {
			k.Fail(kv[0], "required: a topic such as fieldgate")
		} else if err := matcher.ValidateTopic(kv[1]); err != nil {
			// The error quotes the value, shortened if it is long.
			k.Fail(kv[0], "cannot begin a topic: %v; use levels without wildcards, such as site-7/fieldgate", err)
		} else if strings.HasPrefix(kv[1], "$") {
			// The broker takes $ topics, but subscribers to # and +/...,
			// Home Assistant among them, never see them [MQTT-4.7.2-1].
			k.Fail(kv[0], "%q cannot begin the gateway's topics: no filter starting with # or + matches topics starting with $, so subscribers to # would not see them; use one such as site-7/fieldgate", kv[1])
		}
	}
}

// check reports the problems of the keys every sensor has, whatever its
// kind, under p (sensors[i]).
func (s Sensor) check(k *check.Checker, p string, names map[string]string) {
	k.Name(p+".name", s.Name, names)
	if s.Kind == "" {
		k.Fail(p+".kind", "required: the driver, such as bme280")
	}
	if s.Bus == "" {
		k.Fail(p+".bus", "required: an I²C bus number such as 1, gpio, w1, or sim")
	}
	if s.Interval <= 0 {
		k.Fail(p+".interval", "must be positive, such as 10s")
	}
	if s.Jitter < 0 {
		k.Fail(p+".jitter", "%s is negative; use 0s or more, such as 1s", s.Jitter)
	}
	if s.Timeout <= 0 {
		k.Fail(p+".timeout", "must be positive, such as 2s")
	}
	k.IntRange(p+".retries", s.Retries, 0, 10, "2")
	if s.MaxBackoff <= 0 {
		k.Fail(p+".max_backoff", "must be positive, such as 5m")
	}
	k.IntRange(p+".qos", s.QoS, 0, 2, "1")
	chans := map[string]string{}
	for j, ch := range s.Channels {
		cp := fmt.Sprintf("%s.channels[%d]", p, j)
		k.Name(cp+".name", ch.Name, chans)
		if ch.Input == "" {
			k.Fail(cp+".input", "required: the driver's input, such as A0")
		}
		if (len(ch.From) == 0) != (len(ch.To) == 0) {
			k.Fail(cp+".from", "from and to go together: set both, such as from: [0.4, 2.0] and to: [0, 10]")
		} else if len(ch.From) > 0 {
			if len(ch.From) != 2 || len(ch.To) != 2 {
				k.Fail(cp+".from", "from and to take two numbers each, such as from: [0.4, 2.0] and to: [0, 10]")
			} else if ch.From[0] == ch.From[1] {
				k.Fail(cp+".from", "both ends are %g; the scale needs two different values", ch.From[0])
			}
		}
		if len(ch.Range) > 0 && (len(ch.Range) != 2 || ch.Range[0] >= ch.Range[1]) {
			k.Fail(cp+".range", "want [low, high] with low below high, such as [0, 10]")
		}
		k.IntRange(cp+".decimals", ch.Decimals, 0, 9, "3")
	}
}
