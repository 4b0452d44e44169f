package matcher

import (
	"errors"
	"strings"
	"testing"
)

// fuzzTokens are the levels most fuzz bytes decode to; the rest become one
// raw byte, so invalid UTF-8, NUL, stray '+', '#' and '/' all occur.
var fuzzTokens = []string{"a", "b", "", "+", "#", "$x", "ab", "ba", "c", "+", "#", "$SYS", "日本", "x+", "#y"}

var fuzzGroups = []string{"g", "h", "", "g+", "g/h"}

type fuzzReader struct {
	b []byte
}

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) level() string {
	c := r.byte()
	if c < 0xf0 {
		return fuzzTokens[int(c)%len(fuzzTokens)]
	}
	return string([]byte{r.byte()})
}

// name decodes a topic or filter of one to five levels, shared when asked.
func (r *fuzzReader) name(mayShare bool) string {
	head := r.byte()
	parts := make([]string, 1+int(head&0x07)%5)
	for i := range parts {
		parts[i] = r.level()
	}
	s := strings.Join(parts, "/")
	if mayShare && head&0x80 != 0 {
		s = "$share/" + fuzzGroups[int(head>>3)%len(fuzzGroups)] + "/" + s
	}
	return s
}

func sentinel(err error) error {
	for _, e := range allErrs {
		if errors.Is(err, e) {
			return e
		}
	}
	return nil
}

// FuzzIndex decodes a sequence of index operations and checks every Match
// against the oracle.
func FuzzIndex(f *testing.F) {
	f.Add([]byte{0, 1, 0x01, 0, 1, 1, 0, 3, 0x01, 0, 1, 0})
	f.Add([]byte{0, 2, 0x83, 3, 0, 3, 1, 0, 3, 0x82, 3, 0, 3, 0x01, 0, 1, 0})
	f.Add([]byte{1, 1, 0x00, 4, 0, 0, 0, 2, 0x00, 11, 0, 3, 0x01, 11, 0, 0})
	f.Add([]byte{0, 3, 0x84, 0, 3, 0, 1, 4, 0, 0, 4, 0x84, 0, 3, 0, 1, 4, 0, 0, 4, 3, 0, 3, 0x03, 0, 6, 1, 0})
	f.Add([]byte{0, 1, 0x02, 0xf0, 0xff, 3, 1, 2, 3, 0x02, 0xf0, 0x2f, 0})
	f.Add([]byte{0, 5, 0x04, 3, 3, 3, 3, 4, 5, 1, 3, 0x04, 0, 2, 2, 1, 0, 1})
	f.Add([]byte("\x00\x01\x03\x05\x06\x07\x03\x02\x02\x03\x03\x05\x06\x07\x03"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		x, o := NewIndex(), newOracle()
		var res Result
		for step := 0; len(r.b) > 0 && step < 48; step++ {
			switch op := r.byte() % 5; op {
			case 0, 1:
				h := Handle(1 + r.byte()%6)
				filter := r.name(true)
				b := r.byte()
				opts := Options(b % 3)
				// No Local only where it is allowed, so that an invalid
				// filter is the one fault to report.
				if b&0x10 != 0 && !strings.HasPrefix(filter, "$share") {
					opts |= NoLocal
				}
				id := uint32(b>>5) % 4
				verr := ValidateFilter(filter)
				if (verr == nil) != oracleValidFilter(filter) {
					t.Fatalf("ValidateFilter(%q) = %v, but the specification says valid=%v", filter, verr, oracleValidFilter(filter))
				}
				before := x.Len()
				replaced, err := x.Subscribe(h, filter, opts, id)
				if verr != nil {
					if err == nil || sentinel(err) != sentinel(verr) {
						t.Fatalf("Subscribe(%q) = %v, ValidateFilter says %v", filter, err, verr)
					}
					if replaced || x.Len() != before {
						t.Fatalf("failed Subscribe(%q) changed the index", filter)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Subscribe(%d, %q): %v", h, filter, err)
				}
				if want := o.subscribe(h, filter, opts, id); replaced != want {
					t.Fatalf("Subscribe(%d, %q) replaced=%v, want %v", h, filter, replaced, want)
				}
			case 2:
				h := Handle(1 + r.byte()%6)
				filter := r.name(true)
				if got, want := x.Unsubscribe(h, filter), o.unsubscribe(h, filter); got != want {
					t.Fatalf("Unsubscribe(%d, %q) = %v, want %v", h, filter, got, want)
				}
			case 3:
				topic := r.name(false)
				pub := Handle(r.byte() % 7)
				verr := ValidateTopic(topic)
				if (verr == nil) != oracleValidTopic(topic) {
					t.Fatalf("ValidateTopic(%q) = %v, but the specification says valid=%v", topic, verr, oracleValidTopic(topic))
				}
				if verr != nil {
					continue
				}
				e, err := o.match(topic, pub)
				if err != nil {
					t.Fatal(err)
				}
				x.Match(topic, pub, &res)
				if err := verify(e, &res, o.offline); err != nil {
					t.Fatalf("Match(%q, publisher %d): %v\ngot %+v\nsubscriptions %v", topic, pub, err, res.Deliveries, o.sortedKeys())
				}
			case 4:
				h := Handle(1 + r.byte()%6)
				online := r.byte()&1 == 0
				x.SetOnline(h, online)
				o.setOnline(h, online)
			}
		}
		if err := checkCounts(x, o); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzValidate checks the validators against the specification's rules and
// that a valid filter without wildcards matches itself.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		"a", "a/b", "#", "+", "/", "a//b", "a/+/#", "$SYS/#", "$share/g/a/+", "$share/g", "$share//a",
		"a+", "a/#/b", "#a", "a\x00b", "\xff", "日本/+", "$share/g/", "$share/g+/a",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ferr := ValidateFilter(s)
		terr := ValidateTopic(s)
		group, inner, shared := SplitShared(s)
		if (ferr == nil) != oracleValidFilter(s) {
			t.Fatalf("ValidateFilter(%q) = %v, but the specification says valid=%v", s, ferr, oracleValidFilter(s))
		}
		if (terr == nil) != oracleValidTopic(s) {
			t.Fatalf("ValidateTopic(%q) = %v, but the specification says valid=%v", s, terr, oracleValidTopic(s))
		}
		for _, c := range []struct {
			kind string
			err  error
		}{{"filter", ferr}, {"topic", terr}} {
			if c.err == nil {
				continue
			}
			var e *Error
			if !errors.As(c.err, &e) || e.Kind != c.kind || e.Offset < -1 || e.Offset > len(s) {
				t.Fatalf("%s %q: error %#v is not an *Error of kind %s with an offset in range", c.kind, s, c.err, c.kind)
			}
			n := 0
			for _, sentinel := range allErrs {
				if errors.Is(c.err, sentinel) {
					n++
				}
			}
			if n != 1 || c.err.Error() == "" {
				t.Fatalf("%s %q: error %v matches %d sentinels", c.kind, s, c.err, n)
			}
		}
		if ferr != nil {
			return
		}
		if shared {
			if group == "" || inner == "" || "$share/"+group+"/"+inner != s {
				t.Fatalf("SplitShared(%q) = %q, %q", s, group, inner)
			}
			return
		}
		if terr == nil {
			// No wildcards: the filter is also a topic name and matches itself only.
			if !Matches(s, s) {
				t.Fatalf("Matches(%q, itself) = false", s)
			}
			x := NewIndex()
			if _, err := x.Subscribe(1, s, 1, 1); err != nil {
				t.Fatalf("Subscribe(%q): %v", s, err)
			}
			var r Result
			x.Match(s, NoHandle, &r)
			if len(r.Deliveries) != 1 || r.Deliveries[0].Handle != 1 {
				t.Fatalf("index with %q: Match(itself) = %+v", s, r.Deliveries)
			}
			for _, other := range []string{s + "/", s + "/a", "a/" + s} {
				if Matches(s, other) {
					t.Fatalf("Matches(%q, %q) = true", s, other)
				}
			}
			return
		}
		// With wildcards: a topic made by filling them in must match.
		topic := strings.ReplaceAll(strings.ReplaceAll(s, "+", "z"), "#", "z/z")
		if want := oracleMatches(s, topic); Matches(s, topic) != want {
			t.Fatalf("Matches(%q, %q) = %v, want %v", s, topic, !want, want)
		}
	})
}
