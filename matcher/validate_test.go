package matcher

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

var allErrs = []error{
	ErrEmpty, ErrTooLong, ErrNUL, ErrUTF8, ErrWildcardInTopic,
	ErrPlusNotAlone, ErrHashNotAlone, ErrHashNotLast, ErrShareGroup, ErrShareFilter,
	ErrShareNoLocal, ErrNoHandle,
}

func TestErrorsDistinct(t *testing.T) {
	for i, a := range allErrs {
		if a == nil || a.Error() == "" {
			t.Errorf("error %d is nil or has no message", i)
			continue
		}
		for j, b := range allErrs {
			if i != j && errors.Is(a, b) {
				t.Errorf("%v matches %v", a, b)
			}
		}
	}
}

// checkErr checks that err is an *Error of kind wrapping exactly want, about value.
// off, when not nil, is the inclusive byte range Offset must fall in; an
// error about the whole value (empty, too long) may give -1 instead.
func checkErr(t *testing.T, call, kind, value string, err, want error, off []int) {
	t.Helper()
	if err == nil {
		t.Errorf("%s = nil, want %v", call, want)
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("%s = %v, want errors.Is %v", call, err, want)
	}
	for _, other := range allErrs {
		if other != want && errors.Is(err, other) {
			t.Errorf("%s = %v also matches %v", call, err, other)
		}
	}
	msg := err.Error()
	if msg == "" {
		t.Errorf("%s: empty message", call)
	}
	if len(value) <= 64 {
		quoted := strconv.Quote(value)
		if !strings.Contains(msg, value) && !strings.Contains(msg, quoted[1:len(quoted)-1]) {
			t.Errorf("%s: message %q does not name the value", call, msg)
		}
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Errorf("%s = %T, want *Error", call, err)
		return
	}
	if e.Kind != kind {
		t.Errorf("%s: Kind %q, want %q", call, e.Kind, kind)
	}
	if !errors.Is(e.Err, want) {
		t.Errorf("%s: Err %v, want %v", call, e.Err, want)
	}
	if !strings.Contains(value, e.Value) || (value != "" && e.Value == "") {
		t.Errorf("%s: Value %.40q is not the offending value", call, e.Value)
	}
	lo, hi := 0, len(value)
	if off != nil {
		lo, hi = off[0], off[1]
	}
	wholeValue := e.Offset == -1 && (want == ErrEmpty || want == ErrTooLong)
	if !wholeValue && (e.Offset < lo || e.Offset > hi) {
		t.Errorf("%s: Offset %d, want in [%d, %d]", call, e.Offset, lo, hi)
	}
}

var (
	maxFilter  = strings.Repeat("a/", 32767) + "#" // 65535 bytes
	longFilter = strings.Repeat("a", 65536)
	maxTopic   = strings.Repeat("ab/", 21845) // 65535 bytes
	longTopic  = strings.Repeat("ab/", 21845) + "c"
)

func TestValidateFilterValid(t *testing.T) {
	if len(maxFilter) != 65535 || len(longFilter) != 65536 {
		t.Fatal("test strings have the wrong length")
	}
	for _, f := range []string{
		"#", "+", "/", "//", "a", "a/b/c", "a//b", "/a", "a/", "/+", "+/", "+/+", "+/+/#", "a/+/b/#",
		"$SYS/#", "$SYS/+/x", "$", "$share", "$shareholder/a", "$SHARE/g/a",
		"$share/g/a/+", "$share/g/#", "$share/g/+", "$share/g/a//b", "$share/grp-1_x/a", "$share/g/$SYS/#",
		"温度/+/#", "😀/+", "a b/c d", "é/ü", "\u007f", "\uffff",
		maxFilter, strings.Repeat("x", 65535), "$share/g/" + strings.Repeat("x", 65535-9),
	} {
		if err := ValidateFilter(f); err != nil {
			t.Errorf("ValidateFilter(%.40q) = %v, want nil", f, err)
		}
		if !oracleValidFilter(f) {
			t.Errorf("oracleValidFilter(%.40q) = false (fix the oracle)", f)
		}
	}
}

func TestValidateFilterInvalid(t *testing.T) {
	cases := []struct {
		filter string
		want   error
		off    []int
	}{
		{"", ErrEmpty, nil},
		{"a+", ErrPlusNotAlone, []int{0, 1}},
		{"+a", ErrPlusNotAlone, []int{0, 1}},
		{"a/+b", ErrPlusNotAlone, []int{2, 3}},
		{"a/b+/c", ErrPlusNotAlone, []int{2, 3}},
		{"++", ErrPlusNotAlone, []int{0, 1}},
		{"a/#/b", ErrHashNotLast, []int{2, 3}},
		{"#/a", ErrHashNotLast, []int{0, 1}},
		{"#/", ErrHashNotLast, []int{0, 1}},
		{"a/b#", ErrHashNotAlone, []int{2, 3}},
		{"#a", ErrHashNotAlone, []int{0, 1}},
		{"a/#b", ErrHashNotAlone, []int{2, 3}},
		{"##", ErrHashNotAlone, []int{0, 1}},
		{"a\x00b", ErrNUL, []int{1, 1}},
		{"\x00", ErrNUL, []int{0, 0}},
		{"a/b/\x00", ErrNUL, []int{4, 4}},
		{"\xff", ErrUTF8, []int{0, 0}},
		{"a/\xc3", ErrUTF8, []int{2, 2}},
		{"\xed\xa0\x80", ErrUTF8, []int{0, 0}}, // a UTF-16 surrogate
		{"\xc0\xaf", ErrUTF8, []int{0, 0}},     // an overlong encoding
		{longFilter, ErrTooLong, nil},
		{maxFilter + "/", ErrTooLong, nil},
		{"$share//a", ErrShareGroup, nil},
		{"$share/g+/a", ErrShareGroup, nil},
		{"$share/a#/b", ErrShareGroup, nil},
		{"$share/+/a", ErrShareGroup, nil},
		{"$share/#/a", ErrShareGroup, nil},
		{"$share/g", ErrShareFilter, nil},
		{"$share/g/", ErrShareFilter, nil},
		{"$share/g/a+", ErrPlusNotAlone, nil},
		{"$share/g/a/#/b", ErrHashNotLast, nil},
		{"$share/g/a#", ErrHashNotAlone, nil},
	}
	for _, c := range cases {
		err := ValidateFilter(c.filter)
		checkErr(t, "ValidateFilter("+trunc(c.filter)+")", "filter", c.filter, err, c.want, c.off)
		if oracleValidFilter(c.filter) {
			t.Errorf("oracleValidFilter(%s) = true (fix the oracle)", trunc(c.filter))
		}
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return strconv.Quote(s[:40]) + "..."
	}
	return strconv.Quote(s)
}

func TestValidateTopic(t *testing.T) {
	for _, topic := range []string{
		"a", "/", "//", "a//b", "/a", "a/", "$SYS/broker", "$", "温度/センサー", "😀", "a b", "a.b-c_d",
		maxTopic, strings.Repeat("y", 65535),
	} {
		if err := ValidateTopic(topic); err != nil {
			t.Errorf("ValidateTopic(%.40q) = %v, want nil", topic, err)
		}
		if !oracleValidTopic(topic) {
			t.Errorf("oracleValidTopic(%.40q) = false (fix the oracle)", topic)
		}
		// A topic name without wildcards is also a filter that matches it.
		if !strings.HasPrefix(topic, "$share/") {
			if err := ValidateFilter(topic); err != nil {
				t.Errorf("ValidateFilter(%.40q) = %v, want nil", topic, err)
			}
			if !Matches(topic, topic) {
				t.Errorf("Matches(%.40q, itself) = false", topic)
			}
		}
	}
	cases := []struct {
		topic string
		want  error
		off   []int
	}{
		{"", ErrEmpty, nil},
		{"+", ErrWildcardInTopic, []int{0, 0}},
		{"#", ErrWildcardInTopic, []int{0, 0}},
		{"a/+", ErrWildcardInTopic, []int{2, 2}},
		{"a/#", ErrWildcardInTopic, []int{2, 2}},
		{"a#", ErrWildcardInTopic, []int{1, 1}},
		{"a/b+c", ErrWildcardInTopic, []int{3, 3}},
		{"$SYS/#", ErrWildcardInTopic, []int{5, 5}},
		{"a\x00", ErrNUL, []int{1, 1}},
		{"\xff", ErrUTF8, []int{0, 0}},
		{"a/\xed\xbf\xbf", ErrUTF8, []int{2, 2}},
		{longTopic, ErrTooLong, nil},
	}
	for _, c := range cases {
		err := ValidateTopic(c.topic)
		checkErr(t, "ValidateTopic("+trunc(c.topic)+")", "topic", c.topic, err, c.want, c.off)
		if oracleValidTopic(c.topic) {
			t.Errorf("oracleValidTopic(%s) = true (fix the oracle)", trunc(c.topic))
		}
	}
}

func TestSplitShared(t *testing.T) {
	cases := []struct {
		filter, group, inner string
		ok                   bool
	}{
		{"$share/g/a/b", "g", "a/b", true},
		{"$share/g/#", "g", "#", true},
		{"$share/grp/a//b", "grp", "a//b", true},
		{"$share/g/$share/h/a", "g", "$share/h/a", true},
		{"$share/温度/+", "温度", "+", true},
		{"a/b", "", "", false},
		{"#", "", "", false},
		{"$share", "", "", false},
		{"$sharex/g/a", "", "", false},
		{"$SHARE/g/a", "", "", false},
		{"share/g/a", "", "", false},
		{"a/$share/g/a", "", "", false},
	}
	for _, c := range cases {
		group, inner, ok := SplitShared(c.filter)
		if ok != c.ok || ok && (group != c.group || inner != c.inner) {
			t.Errorf("SplitShared(%q) = %q, %q, %v, want %q, %q, %v", c.filter, group, inner, ok, c.group, c.inner, c.ok)
		}
		og, oi, ook := oracleSplitShared(c.filter)
		if ook != c.ok || ook && (og != c.group || oi != c.inner) {
			t.Errorf("oracleSplitShared(%q) wrong (fix the oracle)", c.filter)
		}
	}
}

// TestIsSys: $SYS and the levels below it are the server's; other topics
// beginning with '$', and topics that only start with the same letters,
// are not.
func TestIsSys(t *testing.T) {
	for topic, want := range map[string]bool{
		"$SYS": true, "$SYS/": true, "$SYS/broker/uptime": true, "$SYS/#": true,
		"$SYSTEM/x": false, "$sys/x": false, "$aws/things/t/shadow/update": false, "$iothub/twin/GET/?$rid=1": false,
		"$": false, "SYS/x": false, "a/$SYS": false, "": false,
	} {
		if got := IsSys(topic); got != want {
			t.Errorf("IsSys(%q) = %v, want %v", topic, got, want)
		}
	}
}
