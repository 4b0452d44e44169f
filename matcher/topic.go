package matcher

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLen is the longest topic name or filter MQTT can carry: its length
// prefix is two bytes [MQTT-1.5.4-1].
const MaxLen = 65535

// sharePrefix starts every shared subscription filter [MQTT-4.8.2-1].
const sharePrefix = "$share/"

// Errors returned, wrapped in *Error, by ValidateTopic, ValidateFilter and
// Index.Subscribe. Compare with errors.Is.
var (
	// ErrEmpty reports an empty topic name or filter [MQTT-4.7.3-1].
	ErrEmpty = errors.New("must not be empty")
	// ErrTooLong reports a topic name or filter over MaxLen bytes.
	ErrTooLong = errors.New("longer than 65535 bytes")
	// ErrNUL reports the character U+0000, which MQTT strings must not hold [MQTT-1.5.4-2].
	ErrNUL = errors.New("contains the NUL character U+0000")
	// ErrUTF8 reports bytes that are not well-formed UTF-8 [MQTT-1.5.4-1].
	ErrUTF8 = errors.New("is not valid UTF-8")
	// ErrWildcardInTopic reports '+' or '#' in a topic name used to publish [MQTT-3.3.2-2].
	ErrWildcardInTopic = errors.New("a topic name must not contain the wildcards '+' or '#'")
	// ErrPlusNotAlone reports a '+' that shares its level with other characters [MQTT-4.7.1-2].
	ErrPlusNotAlone = errors.New("'+' must occupy a whole level, as in a/+/b")
	// ErrHashNotAlone reports a '#' that shares its level with other characters [MQTT-4.7.1-1].
	ErrHashNotAlone = errors.New("'#' must occupy a whole level, as in a/#")
	// ErrHashNotLast reports a '#' followed by more levels [MQTT-4.7.1-1].
	ErrHashNotLast = errors.New("'#' must be the last level")
	// ErrShareGroup reports a $share group name that is empty or holds '/', '+' or '#' [MQTT-4.8.2-2].
	ErrShareGroup = errors.New("the $share group name must be at least one character without '/', '+' or '#'")
	// ErrShareFilter reports "$share/{group}" without a filter after it [MQTT-4.8.2-1].
	ErrShareFilter = errors.New("a shared subscription needs a filter after $share/{group}/")
	// ErrShareNoLocal reports No Local set on a shared subscription [MQTT-3.8.3-4].
	ErrShareNoLocal = errors.New("the No Local option must not be set on a shared subscription")
	// ErrNoHandle reports a subscription for NoHandle, which names no
	// session, or for a handle above MaxHandle.
	ErrNoHandle = errors.New("the session handle must be from 1 to MaxHandle (67108863)")
	// ErrQoS reports subscription options granting QoS 3, which MQTT
	// reserves (5.0 §3.8.3.1).
	ErrQoS = errors.New("the subscription options must grant QoS 0, 1 or 2")
)

// Error says what is wrong with a topic name or filter and where.
type Error struct {
	Kind   string // "topic" or "filter"
	Value  string // the topic name or filter as given
	Offset int    // byte offset of the fault, or -1 when it concerns the whole value
	Err    error  // one of the Err* values
}

// Error formats the fault with the value, quoted and shortened if long.
func (e *Error) Error() string {
	v := e.Value
	if len(v) > 96 {
		v = v[:96] + "…"
	}
	if e.Offset >= 0 {
		return fmt.Sprintf("%s %q: %v (at byte %d)", e.Kind, v, e.Err, e.Offset)
	}
	return fmt.Sprintf("%s %q: %v", e.Kind, v, e.Err)
}

// Unwrap returns the Err* value, for errors.Is.
func (e *Error) Unwrap() error { return e.Err }

// checkString applies the rules every MQTT UTF-8 string follows.
func checkString(kind, s string) error {
	switch {
	case s == "":
		return &Error{kind, s, -1, ErrEmpty}
	case len(s) > MaxLen:
		return &Error{kind, s, -1, ErrTooLong}
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		return &Error{kind, s, i, ErrNUL}
	}
	if !utf8.ValidString(s) {
		off := 0
		for off < len(s) {
			r, n := utf8.DecodeRuneInString(s[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return &Error{kind, s, off, ErrUTF8}
	}
	return nil
}

// ValidateTopic checks a topic name a client publishes to.
func ValidateTopic(topic string) error {
	if err := checkString("topic", topic); err != nil {
		return err
	}
	if i := strings.IndexAny(topic, "+#"); i >= 0 {
		return &Error{"topic", topic, i, ErrWildcardInTopic}
	}
	return nil
}

// ValidateFilter checks a topic filter a client subscribes to, including the
// shared form $share/{group}/{filter}.
func ValidateFilter(filter string) error {
	if err := checkString("filter", filter); err != nil {
		return err
	}
	inner, base := filter, 0
	if group, rest, ok := SplitShared(filter); ok {
		if group == "" || strings.ContainsAny(group, "+#") {
			return &Error{"filter", filter, len(sharePrefix), ErrShareGroup}
		}
		if rest == "" {
			return &Error{"filter", filter, len(filter), ErrShareFilter}
		}
		inner, base = rest, len(sharePrefix)+len(group)+1
	}
	start := 0
	for start <= len(inner) {
		end := strings.IndexByte(inner[start:], '/')
		last := end < 0
		if last {
			end = len(inner)
		} else {
			end += start
		}
		level := inner[start:end]
		if i := strings.IndexByte(level, '+'); i >= 0 && len(level) != 1 {
			return &Error{"filter", filter, base + start + i, ErrPlusNotAlone}
		}
		if i := strings.IndexByte(level, '#'); i >= 0 {
			if len(level) != 1 {
				return &Error{"filter", filter, base + start + i, ErrHashNotAlone}
			}
			if !last {
				return &Error{"filter", filter, base + start, ErrHashNotLast}
			}
		}
		start = end + 1
	}
	return nil
}

// SplitShared reports whether filter is a shared subscription and, if so,
// splits it into its group name and the filter after the group. It does not
// validate either part.
func SplitShared(filter string) (group, inner string, ok bool) {
	if !strings.HasPrefix(filter, sharePrefix) {
		return "", filter, false
	}
	rest := filter[len(sharePrefix):]
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return rest, "", true
	}
	return rest[:i], rest[i+1:], true
}

// sysLevel is the first level of the topics a server publishes about
// itself. MQTT leaves topics beginning with '$' to the server's own
// purposes (§4.7.2); $SYS is the one servers share.
const sysLevel = "$SYS"

// IsSys reports whether topic, a topic name or filter, lies in the
// server's own namespace: $SYS or a level below it. Other topics that
// begin with '$', such as AWS IoT's $aws/things/... or Azure IoT Hub's
// $iothub/..., are the clients' to publish, and differ from the rest
// only in that no filter beginning with a wildcard matches them
// [MQTT-4.7.2-1].
func IsSys(topic string) bool {
	return strings.HasPrefix(topic, sysLevel) && (len(topic) == len(sysLevel) || topic[len(sysLevel)] == '/')
}

// Matches reports whether a valid, non-shared filter matches a valid topic
// name. It is the verification every index candidate passes, and the check
// ACLs and retained lookups use. Between wildcards a filter is a literal run
// that the topic must repeat byte for byte, so it compares whole runs.
func Matches(filter, topic string) bool {
	// A leading wildcard never matches a topic beginning with '$' [MQTT-4.7.2-1].
	if topic != "" && topic[0] == '$' && filter != "" && (filter[0] == '+' || filter[0] == '#') {
		return false
	}
	for {
		// In a valid filter the first '+' or '#' is a whole level, and a
		// '#' can only be the last byte.
		w := strings.IndexByte(filter, '+')
		if w < 0 {
			if n := len(filter); n == 0 || filter[n-1] != '#' {
				return filter == topic
			}
			w = len(filter) - 1
		}
		if len(topic) < w || topic[:w] != filter[:w] {
			// "a/#" also matches its parent "a" [MQTT-4.7.1-1].
			return filter[w] == '#' && w > 0 && topic == filter[:w-1]
		}
		if filter[w] == '#' {
			return true
		}
		// '+' takes one topic level, possibly empty.
		topic = topic[w:]
		if k := strings.IndexByte(topic, '/'); k >= 0 {
			topic = topic[k:]
		} else {
			topic = ""
		}
		filter = filter[w+1:]
	}
}
