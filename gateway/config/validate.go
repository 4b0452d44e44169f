package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/matcher"
)

// ErrInvalid is what every *Error wraps, for errors.Is.
var ErrInvalid = errors.New("config: invalid configuration")

// Problem is one thing wrong in a configuration: where, and what would be right.
type Problem struct {
	File string // file name, empty for a Config built in code
	Line int    // 1-based line, 0 when unknown
	Path string // key path such as listeners[1].address; empty for the whole file
	Msg  string
}

// String formats the problem as file:line: path: message, leaving out what is unknown.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error lists every problem found in one configuration.
type Error struct {
	Problems []Problem
}

// Error returns all problems, one per line.
func (e *Error) Error() string {
	if len(e.Problems) == 1 {
		return "config: " + e.Problems[0].String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config: %d problems:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

// newError orders problems as they appear in the file, so a reader can fix
// them top to bottom.
func newError(ps []Problem) *Error {
	slices.SortStableFunc(ps, func(a, b Problem) int { return cmp.Compare(a.Line, b.Line) })
	return &Error{Problems: ps}
}

// source records where a Config was read from.
type source struct {
	file  string
	lines map[string]int
}

// line returns the line path was written on, or that of its nearest written
// ancestor: a missing listeners[1].tls.cert points at listeners[1].tls.
func (s source) line(path string) int {
	for {
		if l, ok := s.lines[path]; ok {
			return l
		}
		if path == "" {
			return 0
		}
		path = path[:max(strings.LastIndexAny(path, ".["), 0)]
	}
}

// Validate checks the whole configuration and returns an *Error listing every
// problem, or nil. It checks shape only: it opens no files and binds no sockets.
func (c *Config) Validate() error {
	if ps := c.problems(); len(ps) > 0 {
		return newError(ps)
	}
	return nil
}

func (c *Config) problems() []Problem {
	k := check.New(c.src.lines, c.src.file != "")

	k.OneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	k.OneOf("log.format", c.Log.Format, "text", "json")

	c.Storage.Check(k)

	c.Broker.Check(k, c.Storage.MaxQueuedBytes)
	broker.CheckListeners(k, c.Listeners)

	c.Ops.Check(k)

	checkGateway(k, c.Gateway)
	names := map[string]string{}
	for i, s := range c.Sensors {
		checkSensor(k, fmt.Sprintf("sensors[%d]", i), s, names)
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
	bridge.Check(k, c.Bridges)
	ps := make([]Problem, 0, len(k.Problems()))
	for _, p := range k.Problems() {
		ps = append(ps, c.Problem(p.Path, "%s", p.Msg))
	}
	for _, check := range extraChecks {
		ps = append(ps, check(c)...)
	}
	return ps
}

// extraChecks are validations owned by other packages; see AddCheck.
var extraChecks []func(*Config) []Problem

// AddCheck adds a validation that needs knowledge this package does not
// have, such as which sensor kinds exist and what options each takes. The
// sensors package adds its check when it is linked in, so Load and
// Validate report driver problems with the same file and line as the rest.
// It must be called during initialization.
func AddCheck(check func(*Config) []Problem) {
	extraChecks = append(extraChecks, check)
}

// Problem returns a problem at path, with the file and line it was written
// on when the Config was read from a file; for AddCheck's checks.
func (c *Config) Problem(path, format string, args ...any) Problem {
	return Problem{File: c.src.file, Line: c.src.line(path), Path: path, Msg: fmt.Sprintf(format, args...)}
}

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
			k.Fail(kv[0], "%q cannot begin a topic: MQTT keeps topics starting with $ for the broker; use one such as site-7/fieldgate", kv[1])
		}
	}
}

func checkSensor(k *check.Checker, p string, s Sensor, names map[string]string) {
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
