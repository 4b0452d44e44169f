package config

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fieldgate/fieldgate/gateway/bridge"
	"github.com/fieldgate/fieldgate/gateway/broker"
	"github.com/fieldgate/fieldgate/internal/check"
)

// ErrInvalid is what every *Error wraps, for errors.Is.
var ErrInvalid = errors.New("config: invalid configuration")

// Problem is one thing wrong in a configuration: where, and what would be right.
type Problem struct {
	File string // file name, empty for a Config built in code
	Line int    // 1-based line, 0 when unknown
	Path string // key path such as listeners[1].address; empty for the whole file
	Msg  string
}

// String formats the problem as file:line: path: message, leaving out what is unknown.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		b.WriteString(": ")
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Error lists every problem found in one configuration.
type Error struct {
	Problems []Problem
}

// Error returns all problems, one per line.
func (e *Error) Error() string {
	if len(e.Problems) == 1 {
		return "config: " + e.Problems[0].String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "config: %d problems:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

// newError orders problems as they appear in the file, so a reader can fix
// them top to bottom.
func newError(ps []Problem) *Error {
	slices.SortStableFunc(ps, func(a, b Problem) int { return cmp.Compare(a.Line, b.Line) })
	return &Error{Problems: ps}
}

// source records where a Config was read from.
type source struct {
	file  string
	lines map[string]int
}

// line returns the line path was written on, or that of its nearest written
// ancestor: a missing listeners[1].tls.cert points at listeners[1].tls.
func (s source) line(path string) int {
	for {
		if l, ok := s.lines[path]; ok {
			return l
		}
		if path == "" {
			return 0
		}
		path = path[:max(strings.LastIndexAny(path, ".["), 0)]
	}
}

// Validate checks the whole configuration and returns an *Error listing every
// problem, or nil. It checks shape only: it opens no files and binds no sockets.
func (c *Config) Validate() error {
	if ps := c.problems(); len(ps) > 0 {
		return newError(ps)
	}
	return nil
}

// Warnings returns what is valid but dangerous in the configuration, such
// as a listener that lets anonymous clients in from the network, each at its
// file and line, in the order of the file. fieldgate check prints them;
// they do not make the configuration invalid.
func (c *Config) Warnings() []Problem {
	k := c.check()
	ps := make([]Problem, 0, len(k.Warnings()))
	for _, p := range k.Warnings() {
		ps = append(ps, Problem{File: c.src.file, Line: c.src.line(p.Path), Path: p.Path, Msg: p.Msg})
	}
	slices.SortStableFunc(ps, func(a, b Problem) int { return cmp.Compare(a.Line, b.Line) })
	return ps
}

// problems runs each section's check, in the order of the file, and
// places every problem at its file and line.
func (c *Config) problems() []Problem {
	k := c.check()
	ps := make([]Problem, 0, len(k.Problems()))
	for _, p := range k.Problems() {
		ps = append(ps, Problem{File: c.src.file, Line: c.src.line(p.Path), Path: p.Path, Msg: p.Msg})
	}
	return ps
}

// check runs each section's check, in the order of the file.
func (c *Config) check() *check.Checker {
	k := check.New(c.src.lines, c.src.file != "")
	c.Log.check(k)
	c.Storage.Check(k)
	c.Broker.Check(k, c.Storage.MaxQueuedBytes)
	broker.CheckListeners(k, c.Listeners)
	c.Ops.Check(k)
	c.SensorsConfig().Check(k)
	bridge.Check(k, c.Bridges)
	broker.WarnAnonymous(k, c.Broker, c.Listeners)
	return k
}

// Problem returns a problem at path, with the file and line it was written
// on when the Config was read from a file: for checks that need more than
// the configuration, such as whether the files it names can be read.
func (c *Config) Problem(path, format string, args ...any) Problem {
	return Problem{File: c.src.file, Line: c.src.line(path), Path: path, Msg: fmt.Sprintf(format, args...)}
}
