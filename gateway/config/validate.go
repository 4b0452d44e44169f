package config

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

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

// MQTT limits on bridge settings.
const (
	maxMQTTKeepalive = 65535 * time.Second      // Keep Alive is a two-byte count of seconds (3.1.1 §3.1.2.10, 5.0 §3.1.2.10)
	maxMQTTTwoByte   = 65535                    // receive maximum is a two-byte integer
	maxSessionExpiry = 4294967295 * time.Second // a four-byte count of seconds (5.0 §3.1.2.11.2)
)

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
	bridges := map[string]string{}
	for i, b := range c.Bridges {
		checkBridge(k, fmt.Sprintf("bridges[%d]", i), b, bridges)
	}
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

func checkBridge(k *check.Checker, p string, b Bridge, names map[string]string) {
	k.Name(p+".name", b.Name, names)
	if b.Address == "" {
		k.Fail(p+".address", "required: the cloud broker's host:port, such as mqtt.example.com:8883")
	} else {
		k.HostPort(p+".address", b.Address, "mqtt.example.com:8883")
	}
	k.OneOf(p+".protocol", b.Protocol, "auto", "5", "3.1.1")
	if b.Password != "" && b.PasswordFile != "" {
		k.Fail(p+".password_file", "set together with password; keep one")
	}
	if (b.TLS.Cert == "") != (b.TLS.Key == "") {
		k.Fail(p+".tls.key", "cert and key go together for mutual TLS; set both or neither")
	}
	if !b.TLS.Enabled && b.TLS != (BridgeTLS{}) {
		k.Fail(p+".tls.enabled", "TLS settings given but tls.enabled is false; set it to true")
	}
	if b.KeepAlive < time.Second || b.KeepAlive > maxMQTTKeepalive {
		k.Fail(p+".keepalive", "%s is out of range; use 1s to 18h12m15s, such as 60s", b.KeepAlive)
	}
	if d := b.SessionExpiry; d < 0 || d > maxSessionExpiry || d%time.Second != 0 {
		k.Fail(p+".session_expiry", "%s is not allowed; use whole seconds up to %s, such as 24h", d, maxSessionExpiry)
	}
	switch {
	case b.ReconnectMin <= 0:
		k.Fail(p+".reconnect_min", "%s is not allowed; use a positive duration, such as 1s", b.ReconnectMin)
	case b.ReconnectMax < b.ReconnectMin:
		k.Fail(k.Either(p+".reconnect_max", p+".reconnect_min"), "want reconnect_min (%s) <= reconnect_max (%s), such as 1s and 2m", b.ReconnectMin, b.ReconnectMax)
	}
	if b.AckTimeout < time.Second {
		k.Fail(p+".ack_timeout", "%s is too short; use 1s or more, such as 30s", b.AckTimeout)
	}
	k.IntRange(p+".max_inflight", b.MaxInflight, 1, maxMQTTTwoByte, "32")
	k.IntRange(p+".rate", b.Rate, 0, 1<<20, "500, or 0 for unpaced")
	k.IntRange(p+".max_outbox_bytes", b.MaxOutboxBytes, 64<<10, int(min(int64(1)<<40, int64(math.MaxInt))), "67108864 (64 MiB)")
	if b.MaxOutboxAge < time.Minute {
		k.Fail(p+".max_outbox_age", "%s is too short; use 1m or more, such as 168h", b.MaxOutboxAge)
	}
	if len(b.Out) == 0 && len(b.In) == 0 {
		k.Fail(p, "has no routes; add out: or in: routes")
	}
	for j, r := range b.Out {
		rp := fmt.Sprintf("%s.out[%d]", p, j)
		checkRouteFilter(k, rp+".filter", r.Filter)
		checkTemplate(k, rp+".topic", r.Topic)
		k.IntRange(rp+".qos", r.QoS, 0, 2, "1")
		k.OneOf(rp+".class", r.Class, ClassTelemetry, ClassAlarm, ClassState)
		if r.MemoryOnly && r.QoS != 0 {
			k.Fail(rp+".memory_only", "only for qos 0 routes: QoS 1/2 messages are kept on disk until acknowledged")
		}
	}
	for j, r := range b.In {
		rp := fmt.Sprintf("%s.in[%d]", p, j)
		checkRouteFilter(k, rp+".filter", r.Filter)
		checkTemplate(k, rp+".topic", r.Topic)
		k.IntRange(rp+".qos", r.QoS, 0, 2, "1")
	}
}

// routeFilter checks a route's filter, with {device} standing for a level.
func checkRouteFilter(k *check.Checker, path, f string) {
	if f == "" {
		k.Fail(path, "required: a topic filter such as fieldgate/{device}/#")
		return
	}
	if err := matcher.ValidateFilter(strings.ReplaceAll(f, "{device}", "device")); err != nil {
		k.Fail(path, "%q is not a valid topic filter: %v", f, err)
	}
}

// template checks a topic template: placeholders {topic}, {device} and
// {1}…{99}, the rest literal, rendering a topic without wildcards.
func checkTemplate(k *check.Checker, path, t string) {
	if t == "" {
		k.Fail(path, "required: a topic template such as site-7/{topic}")
		return
	}
	rest := t
	var b strings.Builder
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(rest[:i])
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			k.Fail(path, "%q has a { without its }", t)
			return
		}
		name := rest[i+1 : i+j]
		if n, err := strconv.Atoi(name); name != "topic" && name != "device" && (err != nil || n < 1 || n > 99) {
			k.Fail(path, "%q has an unknown placeholder {%s}; use {topic}, {device} or a level number such as {2}", t, name)
			return
		}
		b.WriteString("x")
		rest = rest[i+j+1:]
	}
	if err := matcher.ValidateTopic(b.String()); err != nil {
		k.Fail(path, "%q does not make a valid topic: %v", t, err)
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
