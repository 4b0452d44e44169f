package report

import "fmt"

// outcome is whether a target was met.
type outcome int

const (
	unjudged outcome = iota // nothing to judge: not measured
	met
	missed
)

// String is the outcome in the report's headline table.
func (o outcome) String() string {
	switch o {
	case met:
		return "✓ met"
	case missed:
		return "**✗ missed**"
	}
	return "not judged"
}

// verdict is one target judged: what must hold, what was measured and
// whether it holds.
type verdict struct {
	target   string
	measured string
	outcome  outcome
}

// judged returns the verdict on target: met when ok, else missed.
func judged(target string, ok bool, measured string) verdict {
	if ok {
		return verdict{target, measured, met}
	}
	return verdict{target, measured, missed}
}

// notJudged returns a verdict on a target that could not be judged, why
// saying why.
func notJudged(target, why string) verdict { return verdict{target, why, unjudged} }

// cell is the result as a comparison's own table shows it: a ✓ before
// what was met, a ✗ and bold around what was missed.
func (v verdict) cell() string {
	switch v.outcome {
	case met:
		return "✓ " + v.measured
	case missed:
		return "**✗ " + v.measured + "**"
	}
	return v.measured
}

// writeTargets writes the table of a comparison's targets under heading.
func writeTargets(w *markdown, heading string, vs []verdict) {
	w.heading(2, heading)
	rows := make([][]string, len(vs))
	for i, v := range vs {
		rows[i] = []string{v.target, v.cell()}
	}
	w.table("ll", []string{"target", "result"}, rows...)
}

// String is the verdict as a test failure shows it.
func (v verdict) String() string { return fmt.Sprintf("%s: %s (%v)", v.target, v.measured, v.outcome) }
