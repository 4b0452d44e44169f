package bridge

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/fieldgate/fieldgate/internal/mqttwire"
	"github.com/fieldgate/fieldgate/matcher"
)

// template is a compiled topic template: literal text, {topic}, {device}
// and {N} (the Nth level of the source topic, from 1). It is the one
// parser of templates: configuration checks use it too.
type template struct {
	parts []tplPart
}

type tplPart struct {
	lit   string
	level int // >0: that level; -1: the whole topic; 0: lit
}

// maxTemplateLevel is the highest level a placeholder may name: two digits
// reach deeper than any real topic, and a bound keeps a slip such as
// {1000} from being taken as a level.
const maxTemplateLevel = 99

// templateError says what keeps a template from compiling, in the words
// the configuration's problem uses.
type templateError struct {
	template    string
	unclosed    bool   // a { without its }
	placeholder string // otherwise the unknown placeholder's name
}

func (e *templateError) Error() string {
	if e.unclosed {
		return fmt.Sprintf("%q has a { without its }", e.template)
	}
	return fmt.Sprintf("%q has an unknown placeholder {%s}; use {topic}, {device} or a level number such as {2}", e.template, e.placeholder)
}

func compileTemplate(t, device string) (template, error) {
	var tp template
	rest := t
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			tp.parts = append(tp.parts, tplPart{lit: rest})
			break
		}
		if i > 0 {
			tp.parts = append(tp.parts, tplPart{lit: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return template{}, &templateError{template: t, unclosed: true}
		}
		switch name := rest[i+1 : i+j]; name {
		case "topic":
			tp.parts = append(tp.parts, tplPart{level: -1})
		case "device":
			tp.parts = append(tp.parts, tplPart{lit: device})
		default:
			n, err := strconv.Atoi(name)
			if err != nil || n < 1 || n > maxTemplateLevel {
				return template{}, &templateError{template: t, placeholder: name}
			}
			tp.parts = append(tp.parts, tplPart{level: n})
		}
		rest = rest[i+j+1:]
	}
	return tp, nil
}

// standIn renders the template with level for {topic} and every {N}: the
// topic it makes when each placeholder stands for one plain level.
func (tp template) standIn(level string) string {
	var b strings.Builder
	for _, p := range tp.parts {
		if p.level != 0 {
			b.WriteString(level)
		} else {
			b.WriteString(p.lit)
		}
	}
	return b.String()
}

// render makes the topic for source; ok is false when the template names a
// level source does not have, or the result is not a valid topic.
func (tp template) render(source string) (string, bool) {
	if len(tp.parts) == 1 && tp.parts[0].level == -1 {
		return source, true // the common {topic}: no allocation
	}
	var b strings.Builder
	for _, p := range tp.parts {
		switch {
		case p.level == -1:
			b.WriteString(source)
		case p.level > 0:
			lv, ok := level(source, p.level)
			if !ok {
				return "", false
			}
			b.WriteString(lv)
		default:
			b.WriteString(p.lit)
		}
	}
	out := b.String()
	if matcher.ValidateTopic(out) != nil {
		return "", false
	}
	return out, true
}

// level returns the nth level of topic, counting from 1.
func level(topic string, n int) (string, bool) {
	for i := 1; ; i++ {
		j := strings.IndexByte(topic, '/')
		if i == n {
			if j < 0 {
				return topic, true
			}
			return topic[:j], true
		}
		if j < 0 {
			return "", false
		}
		topic = topic[j+1:]
	}
}

// outRoute is a compiled out-route.
type outRoute struct {
	OutRoute
	index  int
	filter string // with {device} replaced
	topic  template
	rules  *topicRules // the bridge's, shared by its out-routes; nil: none
}

// inRoute is a compiled in-route.
type inRoute struct {
	InRoute
	index  int
	filter string
	topic  template
	subID  int // the subscription identifier, 0 when the filter overlaps no other
}

// overlap reports whether the upstream server may send one message for
// both in-route filters, so that only subscription identifiers tell which
// route it came through. A shared subscription receives what the filter
// after its $share/{group}/ matches.
func overlap(a, b string) bool {
	_, a, _ = matcher.SplitShared(a)
	_, b, _ = matcher.SplitShared(b)
	return matcher.Overlaps(a, b)
}

// receives reports whether the upstream server sends topic to a
// subscription of filter: a shared subscription receives what the filter
// after its $share/{group}/ matches.
func receives(filter, topic string) bool {
	_, inner, _ := matcher.SplitShared(filter)
	return matcher.Matches(inner, topic)
}

// subIDFor derives a filter's subscription identifier from the filter
// itself, so that a restarted gateway resuming its upstream session gives
// each filter the identifier the server still holds. taken resolves the
// rare collision deterministically: the next candidate is the hash of the
// filter with a counter appended.
func subIDFor(filter string, taken map[int]bool) int {
	for n := 0; ; n++ {
		h := fnv.New32a()
		h.Write([]byte(filter))
		if n > 0 {
			h.Write([]byte{0, byte(n)})
		}
		id := int(h.Sum32()%mqttwire.MaxSubscriptionID) + 1
		if !taken[id] {
			return id
		}
	}
}

// compileRoutes builds a bridge's routes and gives overlapping in-route
// filters their subscription identifiers.
func compileRoutes(c Config, device string) ([]outRoute, []inRoute, error) {
	outs := make([]outRoute, len(c.Out))
	rules := c.TopicRules.compile()
	for i, r := range c.Out {
		tp, err := compileTemplate(r.Topic, device)
		if err != nil {
			return nil, nil, fmt.Errorf("bridge %s: out[%d].topic: %w", c.Name, i, err)
		}
		outs[i] = outRoute{OutRoute: r, index: i, filter: strings.ReplaceAll(r.Filter, "{device}", device), topic: tp, rules: rules}
	}
	ins := make([]inRoute, len(c.In))
	for i, r := range c.In {
		tp, err := compileTemplate(r.Topic, device)
		if err != nil {
			return nil, nil, fmt.Errorf("bridge %s: in[%d].topic: %w", c.Name, i, err)
		}
		ins[i] = inRoute{InRoute: r, index: i, filter: strings.ReplaceAll(r.Filter, "{device}", device), topic: tp}
	}
	taken := map[int]bool{}
	for i := range ins {
		for j := range ins {
			if i != j && overlap(ins[i].filter, ins[j].filter) {
				ins[i].subID = subIDFor(ins[i].filter, taken)
				taken[ins[i].subID] = true
				break
			}
		}
	}
	return outs, ins, nil
}

// overlapping returns the first pair of in-routes whose filters overlap,
// for the error when the server offers no subscription identifiers.
func overlapping(ins []inRoute) (a, b *inRoute) {
	for i := range ins {
		for j := i + 1; j < len(ins); j++ {
			if overlap(ins[i].filter, ins[j].filter) {
				return &ins[i], &ins[j]
			}
		}
	}
	return nil, nil
}
