package config

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decoder fills a Config from a parsed YAML tree. It walks the tree itself
// rather than using yaml's struct decoding so that it can record the line of
// every key, report unknown keys and bad values by key path, and carry on
// after each problem: one run finds them all.
//
// A null value (a key with nothing after it) means "not set" and keeps the
// default; an explicit empty list (listeners: []) clears a list.
type decoder struct {
	file     string
	lines    map[string]int // key path -> line it was written on
	problems []Problem
	// undecoded lists the paths whose values could not be decoded, so that
	// validation does not report them a second time as missing or zero.
	undecoded []string
}

var durationType = reflect.TypeFor[time.Duration]()

// durationText matches what time.ParseDuration accepts, however large;
// wholeText matches a whole number in decimal, however long.
var (
	durationText = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)
	wholeText    = regexp.MustCompile(`^[-+]?[0-9]+$`)
)

// isNumber reports whether s is a number written without a unit.
func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

func (d *decoder) fail(path string, line int, format string, args ...any) {
	d.problems = append(d.problems, Problem{File: d.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// badValue reports a value that does not fit its key's type.
func (d *decoder) badValue(path string, line int, format string, args ...any) {
	d.fail(path, line, format, args...)
	d.undecoded = append(d.undecoded, path)
}

// covers reports whether path, a key above it, or an item of the list at
// path could not be decoded.
func (d *decoder) covers(path string) bool {
	for _, u := range d.undecoded {
		if path == u || u == "" || strings.HasPrefix(path, u+".") || strings.HasPrefix(path, u+"[") {
			return true
		}
		if item, ok := strings.CutPrefix(u, path+"["); ok && !strings.ContainsAny(item, ".[") {
			return true
		}
	}
	return false
}

// value decodes n into v, which has one of the few kinds the schema uses.
func (d *decoder) value(path string, n *yaml.Node, v reflect.Value) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return
	}
	switch {
	case v.Kind() == reflect.Struct:
		d.mapping(path, n, v)
	case v.Kind() == reflect.Slice:
		d.sequence(path, n, v)
	case v.Kind() == reflect.Map:
		d.stringMap(path, n, v)
	case n.Kind != yaml.ScalarNode:
		d.badValue(path, n.Line, "want %s, got %s", want(v.Type()), shape(n))
	case v.Type() == durationType:
		dur, err := time.ParseDuration(n.Value)
		if err != nil {
			hint := ""
			switch {
			case durationText.MatchString(n.Value):
				// Well formed, so it failed by overflowing.
				d.badValue(path, n.Line, "%s is too long; a duration can be at most %s", n.Value, time.Duration(math.MaxInt64).Truncate(time.Second))
				return
			case isNumber(n.Value):
				hint = fmt.Sprintf(" (add a unit: %ss)", n.Value)
			}
			d.badValue(path, n.Line, "want %s, got %q%s", want(v.Type()), n.Value, hint)
			return
		}
		v.SetInt(int64(dur))
	case v.Kind() == reflect.String:
		// Any scalar is taken as its text, so address: 0x76 stays "0x76".
		v.SetString(n.Value)
	case v.Kind() == reflect.Bool:
		var b bool
		if err := n.Decode(&b); err != nil {
			d.badValue(path, n.Line, "want %s, got %q", want(v.Type()), n.Value)
			return
		}
		v.SetBool(b)
	case v.Kind() == reflect.Int:
		var i int64
		var f float64
		// yaml drops a fraction when it decodes into an integer: qos: 1.5
		// would become 1.
		fraction := n.ShortTag() == "!!float" && (n.Decode(&f) != nil || f != math.Trunc(f))
		if err := n.Decode(&i); err != nil || fraction || v.OverflowInt(i) {
			// A quoted "64" is text, not a number out of range.
			if n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 && wholeText.MatchString(n.Value) {
				d.badValue(path, n.Line, "%s is out of range; a whole number here is from %d to %d", n.Value, math.MinInt, math.MaxInt)
				return
			}
			d.badValue(path, n.Line, "want %s, got %q", want(v.Type()), n.Value)
			return
		}
		v.SetInt(i)
	case v.Kind() == reflect.Float64:
		var f float64
		// Infinity and NaN (.inf, .nan) are YAML numbers, but they would
		// pass every range check and then scale readings into nonsense.
		if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			d.badValue(path, n.Line, "want %s, got %q", want(v.Type()), n.Value)
			return
		}
		v.SetFloat(f)
	default:
		// Only reachable if the schema gains a field of a new kind.
		panic(fmt.Sprintf("config: schema field %s has unsupported type %s", path, v.Type()))
	}
}

func (d *decoder) mapping(path string, n *yaml.Node, v reflect.Value) {
	fields := fieldsOf(v.Type())
	if n.Kind != yaml.MappingNode {
		d.badValue(path, n.Line, "want a mapping with keys %s, got %s", strings.Join(fields.names, ", "), shape(n))
		return
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		kp := joinKey(path, key.Value)
		if first, dup := seen[key.Value]; dup {
			d.fail(kp, key.Line, "set twice (first on line %d); keep one", first)
			continue
		}
		seen[key.Value] = key.Line
		idx, ok := fields.index[key.Value]
		if !ok {
			d.fail(kp, key.Line, "unknown key%s; known keys here: %s", suggest(key.Value, fields.names), strings.Join(fields.names, ", "))
			continue
		}
		d.lines[kp] = key.Line
		d.value(kp, val, v.Field(idx))
	}
}

func (d *decoder) sequence(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.badValue(path, n.Line, "want a list (items starting with \"- \"), got %s", shape(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		ip := fmt.Sprintf("%s[%d]", path, i)
		d.lines[ip] = item.Line
		if def, ok := s.Index(i).Addr().Interface().(itemDefaults); ok {
			def.SetDefaults()
		}
		d.value(ip, item, s.Index(i))
	}
	v.Set(s)
}

// itemDefaults is implemented by list items whose keys have defaults, such
// as a sensor's timeout: the part that owns the item fills it with them
// before its keys are decoded, so a key written in the file always wins.
type itemDefaults interface{ SetDefaults() }

// stringMap decodes a mapping of free-form keys to single values, such as a
// sensor's driver options; its keys are checked later by whoever owns them.
func (d *decoder) stringMap(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		d.badValue(path, n.Line, "want a mapping of names to values, got %s", shape(n))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		for val.Kind == yaml.AliasNode {
			val = val.Alias
		}
		kp := joinKey(path, key.Value)
		if first, dup := seen[key.Value]; dup {
			d.fail(kp, key.Line, "set twice (first on line %d); keep one", first)
			continue
		}
		seen[key.Value] = key.Line
		d.lines[kp] = key.Line
		if val.Kind != yaml.ScalarNode {
			d.badValue(kp, val.Line, "want a single value, got %s", shape(val))
			continue
		}
		m.SetMapIndex(reflect.ValueOf(key.Value), reflect.ValueOf(val.Value))
	}
	v.Set(m)
}

// structFields maps the YAML keys of a struct type to its field indexes.
type structFields struct {
	index map[string]int
	names []string // in declaration order, for messages
}

func fieldsOf(t reflect.Type) structFields {
	f := structFields{index: map[string]int{}}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name == "" || !t.Field(i).IsExported() {
			continue
		}
		f.index[name] = i
		f.names = append(f.names, name)
	}
	return f
}

// want describes what a value of type t looks like in YAML.
func want(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration such as 30s, 5m or 1h30m"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Int:
		return "a whole number"
	case t.Kind() == reflect.Float64:
		return "a finite number, such as 2.5"
	}
	return "a single value"
}

// shape names the kind of YAML node found where another was wanted.
func shape(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// suggest returns ` (did you mean "x"?)` when key is a likely misspelling of
// a known name, else "". Short keys get less slack, so "foo" does not turn
// into a suggestion of "log".
func suggest(key string, names []string) string {
	limit := 1
	if len(key) > 4 {
		limit = 2
	}
	best, bestDist := "", limit+1
	for _, n := range names {
		if dist := editDistance(key, n); dist < bestDist {
			best, bestDist = n, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance counts the single-character insertions, deletions,
// substitutions and adjacent swaps that turn a into b; a swap counts once
// because "levle" for "level" is one slip of the fingers.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
