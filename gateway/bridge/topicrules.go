package bridge

// Topic rules: what an upstream takes as a topic name beyond MQTT's own
// rules. Cloud brokers restrict topics (AWS IoT Core to 256 bytes and 7
// slashes, NATS to what converts to a subject, Azure IoT Hub to its own
// documented topics) and answer a topic they refuse by closing the link or
// dropping the message. Queued, such a message would block the uplink
// behind it or be lost after it was acknowledged; refused at the route, in
// Offer, it never enters the outbox, its publisher can be told, and local
// subscribers still get it.

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/matcher"
)

// TopicRules are an upstream's rules for the topics it takes, the
// topic_rules of a bridge. They apply to the topic each out-route's
// template makes.
type TopicRules struct {
	// Preset fills the keys left out (zero or empty) with a known
	// upstream's rules: aws-iot, azure-iot-hub or nats.
	Preset    string `yaml:"preset"`
	MaxBytes  int    `yaml:"max_bytes"`  // a topic's length in bytes; 0: no limit but MQTT's 65,535
	MaxLevels int    `yaml:"max_levels"` // its levels, one more than its slashes; 0: no limit
	// UncountedPrefix is a run of leading levels, + standing for any one,
	// that max_bytes and max_levels do not count when a topic begins with
	// it (and has a level after it), as AWS IoT does not count the Basic
	// Ingest prefix $aws/rules/{rule}/.
	UncountedPrefix string `yaml:"uncounted_prefix"`
	ForbiddenChars  string `yaml:"forbidden_chars"` // characters no topic may hold
	// Allow, when set, holds filters of the only topics the upstream
	// takes; an empty list written as [] clears a preset's.
	Allow []string `yaml:"allow"`
}

// topicPresets are the rules of the upstreams fieldgate knows, each from
// the upstream's own documentation.
var topicPresets = map[string]TopicRules{
	// AWS IoT Core's message broker quotas: at most 256 bytes and 7
	// slashes (8 levels) in a topic, neither counting the Basic Ingest
	// prefix $aws/rules/{rule}/.
	"aws-iot": {MaxBytes: 256, MaxLevels: 8, UncountedPrefix: "$aws/rules/+"},
	// Azure IoT Hub is not a general broker: a device publishes telemetry
	// (devices/{id}/messages/events/, a module's under
	// devices/{id}/modules/{module}/), twin requests and method answers,
	// and the hub closes the connection of a device that publishes
	// elsewhere.
	"azure-iot-hub": {Allow: []string{
		"devices/+/messages/events/#",
		"devices/+/modules/+/messages/events/#",
		"$iothub/twin/GET/#",
		"$iothub/twin/PATCH/properties/reported/#",
		"$iothub/methods/res/#",
	}},
	// NATS makes a subject of each MQTT topic and refuses one holding
	// whitespace or DEL, which no subject can carry; it closes the link
	// of a client that publishes one.
	"nats": {ForbiddenChars: " \t\n\r\f\x7f"},
}

// presetNames lists the presets for messages, sorted.
func presetNames() string {
	names := make([]string, 0, len(topicPresets))
	for n := range topicPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// resolved returns r with its preset's values in the keys r leaves out.
func (r TopicRules) resolved() TopicRules {
	p, ok := topicPresets[r.Preset]
	if !ok {
		return r
	}
	if r.MaxBytes == 0 {
		r.MaxBytes = p.MaxBytes
	}
	if r.MaxLevels == 0 {
		r.MaxLevels = p.MaxLevels
	}
	if r.UncountedPrefix == "" {
		r.UncountedPrefix = p.UncountedPrefix
	}
	if r.ForbiddenChars == "" {
		r.ForbiddenChars = p.ForbiddenChars
	}
	if r.Allow == nil {
		r.Allow = p.Allow
	}
	return r
}

// DropTopicRules is the drop reason, in Stats.Dropped beside the
// outbox's, of a message an out-route refused because the topic it makes
// breaks the upstream's topic rules.
const DropTopicRules = "topic_rules"

// ErrTopicRules is what every *TopicRuleError wraps: Offer's answer for a
// message whose topic an out-route's upstream does not take.
var ErrTopicRules = errors.New("the upstream's topic rules refuse the topic")

// TopicRuleError says which of an upstream's topic rules a topic breaks.
type TopicRuleError struct {
	Topic  string // the upstream topic, as the route's template made it
	Rule   string // the topic_rules key it breaks
	Detail string // how
}

// Error names the topic, shortened if long, the rule and how it is broken.
func (e *TopicRuleError) Error() string {
	return fmt.Sprintf("topic %q breaks topic_rules.%s: %s", shorten(e.Topic), e.Rule, e.Detail)
}

// Unwrap returns ErrTopicRules.
func (e *TopicRuleError) Unwrap() error { return ErrTopicRules }

// shortLen is how much of a topic a log line or an error quotes: enough
// to recognise any real topic, and a hostile 64 KiB one costs no more.
const shortLen = 200

// shorten cuts s to shortLen bytes, on a character boundary, marking the
// cut.
func shorten(s string) string {
	if len(s) <= shortLen {
		return s
	}
	n := shortLen
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// topicRules are a bridge's TopicRules as its routes apply them; a nil
// *topicRules has no rule and refuses nothing.
type topicRules struct {
	TopicRules          // resolved
	prefix     []string // UncountedPrefix's levels
	log        refusalLog
}

// compile resolves r's preset; it returns nil when no rule is left, so
// that a bridge without rules spends nothing on them.
func (r TopicRules) compile() *topicRules {
	res := r.resolved()
	res.Preset = ""
	if res.MaxBytes == 0 && res.MaxLevels == 0 && res.ForbiddenChars == "" && len(res.Allow) == 0 {
		return nil
	}
	tr := &topicRules{TopicRules: res}
	if res.UncountedPrefix != "" {
		tr.prefix = strings.Split(res.UncountedPrefix, "/")
	}
	return tr
}

// check returns the rule topic breaks, or nil.
func (r *topicRules) check(topic string) *TopicRuleError {
	if r == nil {
		return nil
	}
	if i := strings.IndexAny(topic, r.ForbiddenChars); i >= 0 {
		c, _ := utf8.DecodeRuneInString(topic[i:])
		return &TopicRuleError{topic, "forbidden_chars", fmt.Sprintf("holds %q at byte %d, which the upstream refuses", c, i)}
	}
	counted := r.counted(topic)
	if r.MaxBytes > 0 && len(counted) > r.MaxBytes {
		return &TopicRuleError{topic, "max_bytes", fmt.Sprintf("%d bytes%s; the upstream takes at most %d", len(counted), r.uncounted(counted, topic), r.MaxBytes)}
	}
	if n := strings.Count(counted, "/") + 1; r.MaxLevels > 0 && n > r.MaxLevels {
		return &TopicRuleError{topic, "max_levels", fmt.Sprintf("%d levels%s; the upstream takes at most %d", n, r.uncounted(counted, topic), r.MaxLevels)}
	}
	if len(r.Allow) > 0 && !slices.ContainsFunc(r.Allow, func(f string) bool { return matcher.Matches(f, topic) }) {
		return &TopicRuleError{topic, "allow", "matches none of the filters of the topics the upstream takes"}
	}
	return nil
}

// counted returns what of topic max_bytes and max_levels count: all of it,
// or what follows the uncounted prefix and its slash.
func (r *topicRules) counted(topic string) string {
	if len(r.prefix) == 0 {
		return topic
	}
	rest := topic
	for _, lv := range r.prefix {
		i := strings.IndexByte(rest, '/')
		if i < 0 || lv != "+" && rest[:i] != lv {
			return topic
		}
		rest = rest[i+1:]
	}
	return rest
}

// uncounted notes, for a message, that the prefix was left out.
func (r *topicRules) uncounted(counted, topic string) string {
	if len(counted) == len(topic) {
		return ""
	}
	return " after " + r.UncountedPrefix
}

// Refusals are logged at most once a minute per topic, and at most
// refusalLines lines a minute in all: a publisher that keeps sending a
// bad topic, or a hostile one that makes up a new topic each time, costs
// a few lines, and what goes unlogged is counted in the next line and in
// the drop counter.
const (
	refusalEvery = time.Minute
	refusalLines = 10
)

// refusalLog decides which refusals are logged.
type refusalLog struct {
	mu       sync.Mutex
	since    time.Time            // the current minute began
	lines    int                  // logged in it
	last     map[string]time.Time // topic -> when it was last logged; at most 2 × refusalLines entries
	unlogged int                  // refusals not logged since the last line
}

// allow reports whether a refusal of topic at now is logged, and how many
// were not since the last line.
func (l *refusalLog) allow(topic string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.since) >= refusalEvery {
		l.since, l.lines = now, 0
		for t, at := range l.last {
			if now.Sub(at) >= refusalEvery {
				delete(l.last, t)
			}
		}
	}
	if at, ok := l.last[topic]; ok && now.Sub(at) < refusalEvery || l.lines >= refusalLines {
		l.unlogged++
		return false, 0
	}
	if l.last == nil {
		l.last = make(map[string]time.Time)
	}
	l.last[topic] = now
	l.lines++
	n := l.unlogged
	l.unlogged = 0
	return true, n
}

// refuseTopic counts and, within the log's limits, logs an out-route's
// refusal of local message topic.
func (b *Bridge) refuseTopic(r *outRoute, topic string, e *TopicRuleError) {
	b.ob.mu.Lock()
	b.ob.dropped[DropTopicRules]++
	total := b.ob.dropped[DropTopicRules]
	b.ob.mu.Unlock()
	if ok, unlogged := r.rules.log.allow(e.Topic, time.Now()); ok {
		b.log.Warn("not sent upstream: the topic an out-route makes breaks the upstream's topic rules; local subscribers got it",
			"route", r.index, "topic", shorten(topic), "remote", shorten(e.Topic), "rule", "topic_rules."+e.Rule, "why", e.Detail,
			"refused_total", total, "unlogged_since_last", unlogged)
	}
}

// check reports the problems of a bridge's topic_rules (p is the bridge's
// key path), and of out-routes whose every topic would break them.
func (r TopicRules) check(k *check.Checker, p string, outs []OutRoute) {
	rp := p + ".topic_rules"
	if _, ok := topicPresets[r.Preset]; r.Preset != "" && !ok {
		k.Fail(rp+".preset", "%q is not a preset; use one of %s, or leave it out and set the rules", r.Preset, presetNames())
	}
	k.IntRange(rp+".max_bytes", r.MaxBytes, 0, matcher.MaxLen, "256 (AWS IoT), or 0 for no limit")
	// A topic of 65,535 bytes has at most 32,768 levels.
	k.IntRange(rp+".max_levels", r.MaxLevels, 0, matcher.MaxLen/2+1, "8 (AWS IoT's 7 slashes), or 0 for no limit")
	if f := r.UncountedPrefix; f != "" {
		_, _, shared := matcher.SplitShared(f)
		if err := matcher.ValidateFilter(f); err != nil || shared || strings.Contains(f, "#") {
			k.Fail(rp+".uncounted_prefix", "%q is not a run of levels; write levels with + for any one, such as $aws/rules/+", f)
		}
	}
	switch c := r.ForbiddenChars; {
	case !utf8.ValidString(c):
		k.Fail(rp+".forbidden_chars", "is not valid UTF-8; write the characters, or escapes in double quotes such as \" \\t\\x7f\"")
	case strings.Contains(c, "/"):
		k.Fail(rp+".forbidden_chars", "holds /, which separates levels and is in most topics; limit levels with max_levels")
	}
	for i, f := range r.Allow {
		ap := fmt.Sprintf("%s.allow[%d]", rp, i)
		if err := matcher.ValidateFilter(f); err != nil {
			k.Fail(ap, "%q is not a valid topic filter: %v", f, err)
		} else if _, _, shared := matcher.SplitShared(f); shared {
			k.Fail(ap, "%q is a shared subscription; write the filter after $share/{group}/", f)
		}
	}
	// A route whose template alone breaks a limit would refuse every
	// message: with each placeholder empty, what is left is the least
	// every topic it makes holds.
	tr := r.compile()
	if tr == nil {
		return
	}
	tr.Allow = nil // which topics match depends on the placeholders
	for j, o := range outs {
		tp, err := compileTemplate(o.Topic, "")
		if err != nil {
			continue // reported as the route's own problem
		}
		if e := tr.check(tp.standIn("")); e != nil {
			k.Fail(fmt.Sprintf("%s.out[%d].topic", p, j), "every topic %q makes breaks topic_rules.%s (with its placeholders empty, %s)",
				o.Topic, e.Rule, e.Detail)
		}
	}
}
