package config

import (
	"fmt"
	"strings"
	"testing"
)

// TestSyntaxProblems checks that a file the YAML parser refuses is
// reported at the line that is wrong, with the key written there, even
// where the parser's own line is off by one or missing.
func TestSyntaxProblems(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want wantProblem
	}{
		// The parser says line 2 for these, counting from 0.
		{"list not closed", "log:\n  level: info\n  format: [text\n",
			wantProblem{3, "log.format", "a list opened with [ is not closed with ]"}},
		{"list not closed, more after", "log:\n  level: info\n  format: [text\nstorage:\n  path: x\n",
			wantProblem{3, "log.format", "not closed with ]"}},
		{"mapping not closed", "log:\n  level: info\nbroker: {allow_anonymous: true\n",
			wantProblem{3, "broker", "a mapping opened with { is not closed with }"}},
		{"tab in indentation", "log:\n\tlevel: info\n",
			wantProblem{2, "log.level", "indent with spaces"}},
		{"tab after spaces", "log:\n  level: info\n\tformat: text\n",
			wantProblem{3, "log.format", "indent with spaces"}},
		{"key indented too little", "log:\n  level: info\n format: text\n",
			wantProblem{3, "log.format", "indent the key like the ones above it"}},
		{"key indented too far", "log:\n  level: info\n    format: text\n",
			wantProblem{3, "log.format", "quote a value that contains"}},
		{"second colon", "log:\n  level: a: b\n",
			wantProblem{2, "log.level", "quote a value that contains"}},
		{"quote not closed", "ops:\n  address: 127.0.0.1:9100\n  token: 'abc\n",
			wantProblem{3, "ops.token", "a quoted value is not closed"}},
		{"key without colon", "storage:\n  path: x\nlog\n",
			wantProblem{3, "", `a key needs a ":" after it`}},
		// The parser says line 1 for these, the list's first line.
		{"list item key indented too far", "listeners:\n  - name: a\n   type: tcp\n",
			wantProblem{3, "listeners[0].type", "indent the key"}},
		{"list item key indented too little", "listeners:\n  - name: a\n  type: tcp\n",
			wantProblem{3, "listeners[0].type", "indent the key"}},
		{"list item among keys", "log:\n  level: info\n  - format\n",
			wantProblem{3, "log", "YAML syntax"}},
		{"new list item", "sensors:\n  - {name: a, kind: bme280, bus: sim, interval: 1s}\n  - {name: b, kind: bme280, bus: [sim, interval: 1s}\n",
			wantProblem{3, "sensors[1]", "not closed with ]"}},
		{"list at its key's column", "listeners:\n- name: a\n  type: tcp\n- name: b\n  type: [tcp\n",
			wantProblem{5, "listeners[1].type", "not closed with ]"}},
		{"unquoted port in a list's first item", "listeners:\n  - {name: a, type: tcp, address: :1883}\n",
			wantProblem{2, "listeners[0]", "it needs quotes"}},
		// The parser gives no line for these.
		{"first line", "log: }\n", wantProblem{1, "log", "YAML syntax"}},
		{"unknown alias", "log:\n  level: info\nbroker: *defaults\n",
			wantProblem{3, "broker", "define the anchor"}},
		{"value starting with @", "log:\n  level: @info\n",
			wantProblem{2, "log.level", "quote a value that starts with @"}},
		{"in a later document", "log:\n  level: info\n---\nlog: [a\n",
			wantProblem{4, "log", "not closed with ]"}},
		{"not UTF-8", "log:\n  level: info\n  format: \"t\xe9xt\"\n",
			wantProblem{3, "log.format", "not UTF-8 text: byte 0xe9 at column 13; save the file as UTF-8"}},
		{"not UTF-8 in a key", "log:\n  l\xe9vel: info\n",
			wantProblem{2, "log", "byte 0xe9 at column 4"}},
		{"lines ending in a lone CR", "log:\r  level: info\r  format: [text\r",
			wantProblem{3, "log.format", "not closed with ]"}},
		{"lines ending in CR LF", "log:\r\n  level: info\r\n  format: [text\r\n",
			wantProblem{3, "log.format", "not closed with ]"}},
		{"not UTF-8 after a lone CR", "log:\r  level: \xff\r",
			wantProblem{2, "log.level", "byte 0xff at column 10"}},
		{"not UTF-8 after a multi-line value", "ops:\n  token: \"abc\n    def\xff\"\n",
			wantProblem{3, "", "byte 0xff at column 8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("site.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatal("Parse accepted a broken file")
			}
			got := problemsOf(t, err)
			if len(got) != 1 || !hasProblem(got, tt.want) {
				t.Errorf("got:\n%v\nwant site.yaml:%d: %s: ...%s...", err, tt.want.line, tt.want.path, tt.want.msg)
			}
		})
	}
}

// TestSyntaxProblemLineBeforeMultilineValue checks that a value spread
// over several lines before the fault, which does not parse when cut, is
// not taken for the fault.
func TestSyntaxProblemLineBeforeMultilineValue(t *testing.T) {
	var b strings.Builder
	b.WriteString("sensors:\n  - {name: a, kind: bme280,\n     bus: sim, interval: 1s}\n")
	for range 40 {
		b.WriteString("# padding\n")
	}
	b.WriteString("log:\n  level: [info\n")
	_, err := Parse("site.yaml", []byte(b.String()))
	got := problemsOf(t, err)
	if w := (wantProblem{45, "log.level", "not closed"}); len(got) != 1 || !hasProblem(got, w) {
		t.Errorf("got:\n%v\nwant line %d %s", err, w.line, w.path)
	}
}

// TestSyntaxProblemLineAfterMultilineValues checks that values spread over
// several lines between the parser's line (where the list began) and the
// fault do not stop the search short of the fault.
func TestSyntaxProblemLineAfterMultilineValues(t *testing.T) {
	var b strings.Builder
	b.WriteString("sensors:\n  - name: a\n    kind: bme280\n    bus: sim\n")
	for i := range 12 {
		fmt.Fprintf(&b, "  - {name: s%d, kind: bme280,\n     bus: sim, interval: 1s}\n", i)
	}
	b.WriteString("  - name: z\n   kind: bme280\n")
	_, err := Parse("site.yaml", []byte(b.String()))
	got := problemsOf(t, err)
	if w := (wantProblem{30, "sensors[13].kind", "indent the key"}); len(got) != 1 || !hasProblem(got, w) {
		t.Errorf("got:\n%v\nwant line %d %s", err, w.line, w.path)
	}
}
