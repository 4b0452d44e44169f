package bridge

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
)

// Config is one upstream (cloud) broker and what is carried to and from
// it: an item of the configuration file's bridges: list.
type Config struct {
	Name     string `yaml:"name"`      // unique; names the outbox, the logs and the metrics
	Address  string `yaml:"address"`   // host:port of the cloud broker
	Protocol string `yaml:"protocol"`  // auto (5, falling back to 3.1.1), 5 or 3.1.1
	ClientID string `yaml:"client_id"` // empty: fieldgate-{device}-{name}
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// PasswordFile holds the password on its first line, which keeps the
	// secret out of a configuration file that may be shared.
	PasswordFile string `yaml:"password_file"`
	TLS          TLS    `yaml:"tls"`

	KeepAlive time.Duration `yaml:"keepalive"`
	// SessionExpiry asks the upstream to keep our session (its
	// subscriptions and what it queued for us) across a reconnect.
	SessionExpiry time.Duration `yaml:"session_expiry"`
	ReconnectMin  time.Duration `yaml:"reconnect_min"` // first wait after a failed connection
	ReconnectMax  time.Duration `yaml:"reconnect_max"` // the wait doubles, with full jitter, up to this
	// AckTimeout bounds the wait for a PUBACK, SUBACK or PINGRESP; past it
	// the link is taken as half-open and replaced.
	AckTimeout  time.Duration `yaml:"ack_timeout"`
	MaxInflight int           `yaml:"max_inflight"` // QoS 1/2 messages unacknowledged upstream; the server's Receive Maximum also bounds it
	// Rate paces sending, in messages per second, so a backlog after an
	// outage neither floods the upstream nor starves the gateway; 0 is unpaced.
	Rate           int           `yaml:"rate"`
	MaxOutboxBytes int           `yaml:"max_outbox_bytes"` // what the outbox may hold on disk
	MaxOutboxAge   time.Duration `yaml:"max_outbox_age"`   // older telemetry and state messages are dropped
	// MaxDeadLetterBytes bounds the messages kept aside because the
	// upstream kept refusing them; past it the oldest are dropped.
	MaxDeadLetterBytes int `yaml:"max_dead_letter_bytes"`
	// DeadLetterAfter is how many links in a row the upstream may end on
	// one message before it is moved to the dead letters, so that the
	// messages behind it go on; 0 never moves one.
	DeadLetterAfter int        `yaml:"dead_letter_after"`
	Out             []OutRoute `yaml:"out"`
	In              []InRoute  `yaml:"in"`

	// TopicRules are the upstream's limits on topics: an out-route's
	// topic that breaks them is refused before the outbox (topicrules.go).
	TopicRules TopicRules `yaml:"topic_rules"`
}

// maxDeadLetterAfter bounds dead_letter_after: with the backoff at its
// two-minute ceiling, a hundred failed links hold the uplink for over three
// hours, longer than anyone would want a message to block the rest.
const maxDeadLetterAfter = 100

// SetDefaults fills a bridge with the values of the keys a file leaves
// out; the configuration file calls it before decoding an item's keys.
func (c *Config) SetDefaults() {
	c.Protocol = "auto"
	c.KeepAlive = time.Minute
	// A day covers a long outage of the gateway's own link while the
	// upstream keeps our subscriptions and the commands sent meanwhile.
	c.SessionExpiry = 24 * time.Hour
	c.ReconnectMin = time.Second
	c.ReconnectMax = 2 * time.Minute
	c.AckTimeout = 30 * time.Second
	c.MaxInflight = 32
	// 500 a second drains a day of a busy site's telemetry in minutes
	// while leaving most of a Pi Zero's cores to the broker.
	c.Rate = 500
	c.MaxOutboxBytes = 64 << 20
	c.MaxOutboxAge = 7 * 24 * time.Hour
	// An eighth of the outbox: room for tens of thousands of refused
	// sensor readings for someone to look at, while a route whose every
	// message is refused takes no more of the SD card than that.
	c.MaxDeadLetterBytes = 8 << 20
	// The first link that ends on a message names it; the second sends it
	// alone, after a PINGRESP showed the server keeps the link, and sees
	// the server end the link on it; the third rules out a coincidence.
	// Each further try holds the uplink back for a longer backoff: three
	// links take up to 1+2+4 s with the default reconnect_min.
	c.DeadLetterAfter = 3
}

// TLS configures TLS to the upstream; with Enabled false the link is plain TCP.
type TLS struct {
	Enabled    bool   `yaml:"enabled"`
	CAFile     string `yaml:"ca_file"`     // PEM roots; empty uses the system's
	Cert       string `yaml:"cert"`        // client certificate for mutual TLS
	Key        string `yaml:"key"`         // its private key
	ServerName string `yaml:"server_name"` // the name to verify, when it is not the address's host
}

// Route classes: what an out-route's messages do when the outbox is full.
const (
	ClassTelemetry = "telemetry" // the oldest are dropped to make room
	ClassAlarm     = "alarm"     // never dropped: new QoS 1/2 publishes are refused (0x97) while full
	ClassState     = "state"     // only the latest message per topic is kept while queued
)

// OutRoute carries local messages matching Filter upstream.
type OutRoute struct {
	Filter string `yaml:"filter"` // a local topic filter; {device} is the gateway's name
	// Topic is the remote topic template: {topic} is the local topic,
	// {device} the gateway's name, {1}, {2}… the local topic's levels.
	Topic      string `yaml:"topic"`
	QoS        int    `yaml:"qos"`
	Retain     bool   `yaml:"retain"`
	Class      string `yaml:"class"`       // telemetry, alarm or state
	MemoryOnly bool   `yaml:"memory_only"` // QoS 0 only: kept in memory, not on the SD card
}

// SetDefaults fills an out-route with the values of the keys a file leaves out.
func (r *OutRoute) SetDefaults() {
	r.Topic = "{topic}"
	r.QoS = 1
	r.Class = ClassTelemetry
}

// InRoute brings remote messages matching Filter to local subscribers.
type InRoute struct {
	Filter string `yaml:"filter"` // a remote topic filter; {device} is the gateway's name
	// Topic is the local topic template: {topic} is the remote topic,
	// {device} the gateway's name, {1}, {2}… the remote topic's levels.
	Topic string `yaml:"topic"`
	QoS   int    `yaml:"qos"`
}

// SetDefaults fills an in-route with the values of the keys a file leaves out.
func (r *InRoute) SetDefaults() {
	r.Topic = "{topic}"
	r.QoS = 1
}

// Check reports the problems of the bridges: list to k.
func Check(k *check.Checker, bridges []Config) {
	names := map[string]string{}
	for i, b := range bridges {
		b.check(k, fmt.Sprintf("bridges[%d]", i), names)
	}
}

func (c Config) check(k *check.Checker, p string, names map[string]string) {
	k.Name(p+".name", c.Name, names)
	if c.Address == "" {
		k.Fail(p+".address", "required: the cloud broker's host:port, such as mqtt.example.com:8883")
	} else {
		k.HostPort(p+".address", c.Address, "mqtt.example.com:8883")
	}
	k.OneOf(p+".protocol", c.Protocol, "auto", "5", "3.1.1")
	if c.Password != "" && c.PasswordFile != "" {
		k.Fail(p+".password_file", "set together with password; keep one")
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		k.Fail(p+".tls.key", "cert and key go together for mutual TLS; set both or neither")
	}
	if !c.TLS.Enabled && c.TLS != (TLS{}) {
		k.Fail(p+".tls.enabled", "TLS settings given but tls.enabled is false; set it to true")
	}
	if c.KeepAlive < time.Second || c.KeepAlive > mqttwire.MaxKeepAlive {
		k.Fail(p+".keepalive", "%s is out of range; use 1s to %s, such as 60s", c.KeepAlive, mqttwire.MaxKeepAlive)
	}
	if d := c.SessionExpiry; d < 0 || d > mqttwire.MaxSessionExpiry || d%time.Second != 0 {
		k.Fail(p+".session_expiry", "%s is not allowed; use whole seconds up to %s, such as 24h", d, mqttwire.MaxSessionExpiry)
	}
	switch {
	case c.ReconnectMin <= 0:
		k.Fail(p+".reconnect_min", "%s is not allowed; use a positive duration, such as 1s", c.ReconnectMin)
	case c.ReconnectMax < c.ReconnectMin:
		k.Fail(k.Either(p+".reconnect_max", p+".reconnect_min"), "want reconnect_min (%s) <= reconnect_max (%s), such as 1s and 2m", c.ReconnectMin, c.ReconnectMax)
	}
	if c.AckTimeout < time.Second {
		k.Fail(p+".ack_timeout", "%s is too short; use 1s or more, such as 30s", c.AckTimeout)
	}
	k.IntRange(p+".max_inflight", c.MaxInflight, 1, mqttwire.MaxTwoByte, "32")
	k.IntRange(p+".rate", c.Rate, 0, 1<<20, "500, or 0 for unpaced")
	k.IntRange(p+".max_outbox_bytes", c.MaxOutboxBytes, 64<<10, int(min(int64(1)<<40, int64(math.MaxInt))), "67108864 (64 MiB)")
	k.IntRange(p+".max_dead_letter_bytes", c.MaxDeadLetterBytes, 64<<10, int(min(int64(1)<<40, int64(math.MaxInt))), "8388608 (8 MiB)")
	if n := c.DeadLetterAfter; n == 1 || n < 0 || n > maxDeadLetterAfter {
		k.Fail(p+".dead_letter_after", "%d is not allowed; use 2 to %d (the first failure only names a suspect, the second is its own), such as 3, or 0 to never move a message aside", n, maxDeadLetterAfter)
	}
	if c.MaxOutboxAge < time.Minute {
		k.Fail(p+".max_outbox_age", "%s is too short; use 1m or more, such as 168h", c.MaxOutboxAge)
	}
	if len(c.Out) == 0 && len(c.In) == 0 {
		k.Fail(p, "has no routes; add out: or in: routes")
	}
	c.TopicRules.check(k, p, c.Out)
	for j, r := range c.Out {
		rp := fmt.Sprintf("%s.out[%d]", p, j)
		checkRouteFilter(k, rp+".filter", r.Filter)
		checkTemplate(k, rp+".topic", r.Topic)
		k.IntRange(rp+".qos", r.QoS, 0, 2, "1")
		k.OneOf(rp+".class", r.Class, ClassTelemetry, ClassAlarm, ClassState)
		if r.MemoryOnly && r.QoS != 0 {
			k.Fail(rp+".memory_only", "only for qos 0 routes: QoS 1/2 messages are kept on disk until acknowledged")
		}
	}
	for j, r := range c.In {
		rp := fmt.Sprintf("%s.in[%d]", p, j)
		checkRouteFilter(k, rp+".filter", r.Filter)
		checkTemplate(k, rp+".topic", r.Topic)
		checkNotSys(k, rp+".topic", r.Filter, r.Topic)
		k.IntRange(rp+".qos", r.QoS, 0, 2, "1")
	}
}

// checkRouteFilter checks a route's filter, with {device} standing for a level.
func checkRouteFilter(k *check.Checker, path, f string) {
	if f == "" {
		k.Fail(path, "required: a topic filter such as fieldgate/{device}/#")
		return
	}
	if err := matcher.ValidateFilter(strings.ReplaceAll(f, "{device}", "device")); err != nil {
		k.Fail(path, "%q is not a valid topic filter: %v", f, err)
	}
}

// checkTemplate checks a topic template with the parser the routes are
// compiled with, and that it renders a topic without wildcards when every
// placeholder stands for a plain level.
func checkTemplate(k *check.Checker, path, t string) {
	if t == "" {
		k.Fail(path, "required: a topic template such as site-7/{topic}")
		return
	}
	tp, err := compileTemplate(t, "x")
	if err != nil {
		k.Fail(path, "%v", err)
		return
	}
	if err := matcher.ValidateTopic(tp.standIn("x")); err != nil {
		k.Fail(path, "%q does not make a valid topic: %v", t, err)
	}
}

// checkNotSys refuses an in-route whose local topics are $SYS topics,
// which belong to the broker: the template made from a topic its filter
// receives, with x for each wildcard and {device}.
func checkNotSys(k *check.Checker, path, filter, t string) {
	tp, err := compileTemplate(t, "x")
	if err != nil {
		return // reported by checkTemplate
	}
	_, inner, _ := matcher.SplitShared(strings.ReplaceAll(filter, "{device}", "x"))
	levels := strings.Split(inner, "/")
	for i, lv := range levels {
		if lv == "+" || lv == "#" {
			levels[i] = "x"
		}
	}
	if local, ok := tp.render(strings.Join(levels, "/")); ok && matcher.IsSys(local) {
		k.Fail(path, "%q makes $SYS topics such as %s, which are the broker's own; map them elsewhere, such as cloud/{topic}", t, local)
	}
}
