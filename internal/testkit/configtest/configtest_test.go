package configtest

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

type item struct {
	Name    string            `yaml:"name"`
	Every   time.Duration     `yaml:"every"`
	QoS     int               `yaml:"qos"`
	Options map[string]string `yaml:"options"`
	Points  []float64         `yaml:"points"`
}

func (i *item) SetDefaults() { i.QoS = 1 }

type file struct {
	Head  struct{ Prefix, Name string } `yaml:"head"`
	Items []item                        `yaml:"items"`
}

func TestDecode(t *testing.T) {
	var f file
	f.Head.Prefix = "kept"
	Decode(t, "items:\n  - {name: 0x76, every: 1m30s, options: {a: 4.096, b: true}, points: [0, 1e3]}\n  - {name: b, qos: 0}\n", &f)
	want := []item{
		{Name: "0x76", Every: 90 * time.Second, QoS: 1, Options: map[string]string{"a": "4.096", "b": "true"}, Points: []float64{0, 1000}},
		{Name: "b", QoS: 0},
	}
	if !reflect.DeepEqual(f.Items, want) || f.Head.Prefix != "kept" {
		t.Errorf("decoded %+v, want items %+v and the head kept", f, want)
	}
}

func TestDecodeRefuses(t *testing.T) {
	for doc, want := range map[string]string{
		"items:\n  - {name: a, nmae: b}\n": "line 2: items[0].nmae: unknown key",
		"items:\n  - {every: 60}\n":        "items[0].every",
		"items: {name: a}\n":               "line 1: items: want a list",
		"items:\n  - [a]\n":                "items[0]: want a mapping",
	} {
		var root yaml.Node
		if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
			t.Fatal(err)
		}
		var f file
		err := decode("", root.Content[0], reflect.ValueOf(&f).Elem())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want one containing %q", doc, err, want)
		}
	}
}
