// Package configtest reads, for a part's tests, YAML written for the part's
// sections of the configuration file, the way the file itself is read: a
// list item is filled with its defaults (its SetDefaults method) before its
// keys are decoded, a key its type does not have is an error, a string
// takes any scalar as written (address: 0x76 stays "0x76"), and a duration
// is written as 30s. The file's own decoder is gateway/config's, which
// imports every part to compose the schema, so a part's tests cannot use
// it; this one keeps no lines and stops at the first problem.
package configtest

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// Decode decodes doc into v, a pointer to a struct whose yaml tags name
// the sections (fields left out of doc keep what v held), and fails t on
// any problem.
func Decode(t testing.TB, doc string, v any) {
	t.Helper()
	var root yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader([]byte(doc))).Decode(&root); err != nil {
		t.Fatalf("configtest: %v", err)
	}
	if len(root.Content) == 0 {
		return
	}
	if err := decode("", root.Content[0], reflect.ValueOf(v).Elem()); err != nil {
		t.Fatalf("configtest: %v", err)
	}
}

// defaulter is a list item with defaults of its own, such as a sensor.
type defaulter interface{ SetDefaults() }

var durationType = reflect.TypeFor[time.Duration]()

func decode(path string, n *yaml.Node, v reflect.Value) error {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	switch {
	case v.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("line %d: %s: want a mapping", n.Line, path)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i]
			f, ok := field(v.Type(), key.Value)
			if !ok {
				return fmt.Errorf("line %d: %s: unknown key", key.Line, join(path, key.Value))
			}
			if err := decode(join(path, key.Value), n.Content[i+1], v.Field(f)); err != nil {
				return err
			}
		}
	case v.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fmt.Errorf("line %d: %s: want a list", n.Line, path)
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			if d, ok := s.Index(i).Addr().Interface().(defaulter); ok {
				d.SetDefaults()
			}
			if err := decode(fmt.Sprintf("%s[%d]", path, i), item, s.Index(i)); err != nil {
				return err
			}
		}
		v.Set(s)
	case n.Kind != yaml.ScalarNode && v.Kind() != reflect.Map:
		return fmt.Errorf("line %d: %s: want a single value", n.Line, path)
	case v.Type() == durationType:
		d, err := time.ParseDuration(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: %s: %v", n.Line, path, err)
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(n.Value)
	default:
		// Numbers, booleans and maps of them: yaml's own rules.
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return fmt.Errorf("line %d: %s: %v", n.Line, path, err)
		}
	}
	return nil
}

// field returns the index of t's field whose yaml tag is key.
func field(t reflect.Type, key string) (int, bool) {
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name == key && t.Field(i).IsExported() {
			return i, true
		}
	}
	return 0, false
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
