package report

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// markdown writes every Markdown file of the package: a comparison's
// summary standing alone, and the same summary as a section of the report,
// where its headings sit shift levels lower.
type markdown struct {
	b     strings.Builder
	shift int
}

// String returns what has been written.
func (m *markdown) String() string { return m.b.String() }

// heading writes a heading of level (1 for "#") plus the shift.
func (m *markdown) heading(level int, text string) {
	fmt.Fprintf(&m.b, "%s %s\n\n", strings.Repeat("#", min(level+m.shift, 6)), text)
}

// para writes a paragraph.
func (m *markdown) para(text string) { m.b.WriteString(text + "\n\n") }

// list writes a bulleted list.
func (m *markdown) list(items ...string) {
	for _, it := range items {
		m.b.WriteString("- " + it + "\n")
	}
	m.b.WriteString("\n")
}

// table writes a table. align has a letter per column: l (left), r
// (right) or c (centred); columns past its end are right-aligned.
func (m *markdown) table(align string, head []string, rows ...[]string) {
	m.row(head)
	m.b.WriteString("|")
	for i := range head {
		switch {
		case i < len(align) && align[i] == 'l':
			m.b.WriteString("---|")
		case i < len(align) && align[i] == 'c':
			m.b.WriteString(":-:|")
		default:
			m.b.WriteString("--:|")
		}
	}
	m.b.WriteString("\n")
	for _, r := range rows {
		m.row(r)
	}
	m.b.WriteString("\n")
}

func (m *markdown) row(cells []string) {
	m.b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
}

// document returns the text without blank lines at its end but for the
// final newline.
func (m *markdown) document() string {
	return strings.TrimRight(m.b.String(), "\n") + "\n"
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// The number formats of the tables. Each comparison has kept the one its
// tables were first written with, which their tests pin down.

// figure formats the broker, storage and bridge figures: about three
// significant digits, rounded to whole and grouped by thousands from 100
// up, and whole numbers below 100 with one decimal (0.0, 42.0).
func figure(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 100:
		return thousands(v)
	case a >= 10 || a == math.Trunc(a):
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// number formats the report's own tables: grouped by thousands from 1,000
// up, three significant digits below, and whole numbers without decimals.
func number(v float64) string {
	if math.Abs(v) >= 1000 {
		return thousands(v)
	}
	return plain(v)
}

// plain formats the matcher's figures: as number, without grouping.
func plain(v float64) string {
	a := math.Abs(v)
	switch {
	case v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// small formats figures well below one, such as fsyncs per message, with
// three significant digits.
func small(v float64) string {
	if v >= 100 || v == 0 {
		return figure(v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// ratio formats a ratio with two decimals below 10 and one from 10 up.
func ratio(r float64) string {
	if r >= 10 {
		return strconv.FormatFloat(r, 'f', 1, 64) + "×"
	}
	return strconv.FormatFloat(r, 'f', 2, 64) + "×"
}

// constant formats a target as written in the source: 1.5, 4.
func constant(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// pct formats a fraction as a whole percentage.
func pct(r float64) string { return strconv.FormatFloat(100*r, 'f', 0, 64) + "%" }

// thousands rounds v to a whole number and groups its digits by three.
func thousands(v float64) string {
	return groupDigits(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
}

// groupDigits groups a whole number such as "-100000" by three digits,
// "-100,000"; anything else it returns as it is.
func groupDigits(n string) string {
	digits := strings.TrimPrefix(n, "-")
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return n
	}
	var b strings.Builder
	b.WriteString(n[:len(n)-len(digits)])
	for i := range len(digits) {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteByte(digits[i])
	}
	return b.String()
}

// decimal formats v with dec decimals, or grouped by thousands for none.
func decimal(v float64, dec int) string {
	if dec == 0 {
		return thousands(v)
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

// duration formats seconds as "19 min 12 s".
func duration(secs int) string {
	if secs < 60 {
		return fmt.Sprintf("%d s", secs)
	}
	return fmt.Sprintf("%d min %02d s", secs/60, secs%60)
}

// plural formats "1 run", "3 runs".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// orUnknown returns s, or "unknown" when it is empty.
func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
