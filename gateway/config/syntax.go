package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// A file the YAML parser refuses is reported like every other problem:
// the line, the key written there and what to do about it. The parser's
// own line cannot be used as it is: for a parser error (as opposed to a
// scanner error) it counts from 0 and names where the enclosing block
// began, and on the first line, or for an unknown alias, it gives none.
// So the line is found by parsing ever longer beginnings of the file: the
// broken line is the one whose addition stops the text from parsing.

// syntaxProblem describes why data is not a YAML document; err is the
// parser's error for it.
func syntaxProblem(name string, data []byte, err error) Problem {
	ends := lineEnds(data)
	if i := invalidUTF8(data); i >= 0 {
		// The parser says only that some byte is not UTF-8; say which.
		line := lineOf(ends, i)
		start := lineStart(ends, line)
		p := Problem{File: name, Line: line, Msg: fmt.Sprintf("not UTF-8 text: byte 0x%02x at column %d; save the file as UTF-8", data[i], 1+utf8.RuneCount(data[start:i]))}
		// The lines before may not parse on their own (a quoted value
		// spread over lines is cut); then the key cannot be placed.
		if before, ok := parses(data[:start]); ok {
			p.Path = keyAt(before, lineText(data, ends, line))
		}
		return p
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	hint := 0 // the parser's line
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, convErr := strconv.Atoi(num); convErr == nil {
				hint, msg = n, after
			}
		}
	}
	line, before := brokenLine(data, ends, hint)
	text := lineText(data, ends, line)
	return Problem{File: name, Line: line, Path: keyAt(before, text), Msg: "YAML syntax: " + msg + syntaxHint(msg, text)}
}

// lineEnds returns the offset just past each line of data, its break
// included. Lines end where YAML's do: at \n, \r\n, a lone \r, and U+0085,
// U+2028 or U+2029.
func lineEnds(data []byte) []int {
	var ends []int
	for i := 0; i < len(data); i++ {
		switch {
		case data[i] == '\n', data[i] == '\r' && (i+1 == len(data) || data[i+1] != '\n'):
			ends = append(ends, i+1)
		case bytes.HasPrefix(data[i:], []byte("\u0085")):
			ends = append(ends, i+2)
		case bytes.HasPrefix(data[i:], []byte("\u2028")), bytes.HasPrefix(data[i:], []byte("\u2029")):
			ends = append(ends, i+3)
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] < len(data) {
		ends = append(ends, len(data))
	}
	return ends
}

// lineOf returns the 1-based line holding the byte at offset off.
func lineOf(ends []int, off int) int {
	line := 1
	for line < len(ends) && ends[line-1] <= off {
		line++
	}
	return line
}

// lineStart returns the offset of the 1-based line.
func lineStart(ends []int, line int) int {
	if line < 2 {
		return 0
	}
	return ends[line-2]
}

// lineText returns the 1-based line of data without its break.
func lineText(data []byte, ends []int, line int) string {
	return strings.TrimRight(string(data[lineStart(ends, line):ends[line-1]]), "\r\n\u0085\u2028\u2029")
}

// invalidUTF8 returns the offset of the first byte of data that is not
// UTF-8, or -1.
func invalidUTF8(data []byte) int {
	for i := 0; i < len(data); {
		r, n := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// parses reports whether text is YAML, every document of it, and returns
// the root node of its first document (nil when it has none).
func parses(text []byte) (*yaml.Node, bool) {
	dec := yaml.NewDecoder(bytes.NewReader(text))
	var root *yaml.Node
	for first := true; ; first = false {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return root, true
		}
		if err != nil {
			return nil, false
		}
		if first && len(doc.Content) > 0 {
			root = doc.Content[0]
		}
	}
}

// brokenLine returns the 1-based line of data (which does not parse) whose
// addition to the lines before it stops them from parsing, and the root of
// those lines. A beginning cut inside a value spread over several lines
// does not parse either, so the search cuts only before lines that start
// something: it narrows the range by binary search over the lines of the
// range's outermost indentation (top-level keys, then a list's items, and
// so on), and scans the last few lines one by one. hint is the parser's
// line, which is never after the broken one.
func brokenLine(data []byte, ends []int, hint int) (int, *yaml.Node) {
	lo, hi := 0, len(ends) // the first lo lines parse; all hi of them do not
	var loRoot *yaml.Node
	if from := hint - 2; from > 0 && from < hi {
		if root, ok := parses(data[:ends[from-1]]); ok {
			lo, loRoot = from, root
		}
	}
	for hi-lo > 1 {
		cuts := startCuts(data, ends, lo, hi)
		if len(cuts) == 0 {
			break
		}
		// The last cut that parses, and the first after it that does not.
		i, j := -1, len(cuts)
		for j-i > 1 {
			mid := (i + j) / 2
			if root, ok := parses(data[:ends[cuts[mid]-1]]); ok {
				i, loRoot = mid, root
			} else {
				j = mid
			}
		}
		if i >= 0 {
			lo = cuts[i]
		}
		if j < len(cuts) {
			hi = cuts[j]
		}
	}
	for k := hi - 1; k > lo; k-- {
		if root, ok := parses(data[:ends[k-1]]); ok {
			return k + 1, root
		}
	}
	return lo + 1, loRoot
}

// startCuts returns the lengths k, lo < k < hi, of the beginnings of data
// that end just before a line at the outermost indentation of lines lo+2
// to hi: lines that start a key or an item rather than continue a value.
// Blank lines and comments start nothing.
func startCuts(data []byte, ends []int, lo, hi int) []int {
	indent := func(line int) int {
		text := lineText(data, ends, line)
		body := strings.TrimLeft(text, " ")
		if body == "" || body[0] == '#' || strings.TrimSpace(body) == "" {
			return -1
		}
		return len(text) - len(body)
	}
	least := -1
	for line := lo + 2; line <= hi; line++ {
		if n := indent(line); n >= 0 && (least < 0 || n < least) {
			least = n
		}
	}
	var cuts []int
	for line := lo + 2; line <= hi && least >= 0; line++ {
		if indent(line) == least {
			cuts = append(cuts, line-1)
		}
	}
	return cuts
}

// keyAt names the key that line text writes, from where its indentation
// puts it among the keys of the lines before it (root); it is the
// enclosing key's path when the line writes no key of its own, and "" at
// the top level.
func keyAt(root *yaml.Node, text string) string {
	col, item, key := lineShape(text)
	if root == nil {
		return key
	}
	path, n := "", root
	for {
		switch n.Kind {
		case yaml.MappingNode:
			if len(n.Content) < 2 {
				return under(path, key)
			}
			k, v := n.Content[len(n.Content)-2], n.Content[len(n.Content)-1]
			if col <= k.Column && !(item && v.Kind == yaml.SequenceNode && col == v.Column) {
				return under(path, key) // a key beside k
			}
			parent := path
			path = under(path, k.Value)
			switch {
			case v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode:
				n = v
			case v.Tag == "!!null":
				if item {
					path += "[0]"
				}
				return under(path, key) // the first line of k's value
			case key != "":
				return under(parent, key) // a key beside k, indented too far
			default:
				return path // more of k's value
			}
		case yaml.SequenceNode:
			switch {
			case item && col == n.Column:
				return under(fmt.Sprintf("%s[%d]", path, len(n.Content)), key)
			case col < n.Column || len(n.Content) == 0:
				return path
			}
			path = fmt.Sprintf("%s[%d]", path, len(n.Content)-1)
			n = n.Content[len(n.Content)-1]
		default:
			return path
		}
	}
}

// under is joinKey for a key that may be missing.
func under(path, key string) string {
	if key == "" {
		return path
	}
	return joinKey(path, key)
}

// lineShape returns the 1-based column where text starts after its
// indentation, whether it starts a list item ("- "), and the plain key it
// writes, if any.
func lineShape(text string) (col int, item bool, key string) {
	rest := strings.TrimLeft(text, " \t")
	col = 1 + len(text) - len(rest)
	if after, ok := strings.CutPrefix(rest, "-"); ok && (after == "" || after[0] == ' ') {
		item, rest = true, strings.TrimLeft(after, " ")
	}
	k, _, found := strings.Cut(rest, ":")
	if !found || k == "" || !utf8.ValidString(k) || strings.ContainsAny(k, " \t{}[],#&*!|>'\"%@`") {
		return col, item, ""
	}
	return col, item, k
}

// syntaxHints say, for the parser's messages a hand-written file most
// often earns, what to change.
var syntaxHints = []struct{ problem, hint string }{
	{"expected ',' or ']'", "a list opened with [ is not closed with ]"},
	{"expected ',' or '}'", "a mapping opened with { is not closed with }"},
	{"unexpected end of stream", "a quoted value is not closed"},
	{"mapping values are not allowed", `a second ": " on the line: quote a value that contains ": ", or indent the key like the ones above it`},
	{"did not find expected key", "indent the key like the ones above it"},
	{"did not find expected '-' indicator", "indent the key like the ones above it"},
	{"could not find expected ':'", `a key needs a ":" after it, and a value on the next line needs more indentation than its key`},
	{"unknown anchor", "define the anchor (&name) before the alias (*name) that uses it"},
	{"cannot start any token", "quote a value that starts with @ or `"},
	{"did not find expected node content", "a value is missing, or it needs quotes (as :1883 does)"},
}

// syntaxHint returns advice on the parser's message msg about line text,
// with a leading "; ", or "" when there is none to give.
func syntaxHint(msg, text string) string {
	indent := text[:len(text)-len(strings.TrimLeft(text, " \t"))]
	if strings.Contains(indent, "\t") {
		return "; indent with spaces: YAML does not allow tabs in indentation"
	}
	for _, h := range syntaxHints {
		if strings.Contains(msg, h.problem) {
			return "; " + h.hint
		}
	}
	return ""
}
