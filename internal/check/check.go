// Package check is how each part of fieldgate validates its own section of
// the configuration file. A part reports what is wrong to a Checker by key
// path (listeners[1].address) and what would be right; the configuration
// package, which composes the sections and read the file, gives the Checker
// the line of every key the file wrote and turns each problem into
// file:line: key: message.
//
// The contract: a check reads values only (it opens no files and binds no
// sockets) and reports every problem it finds, not the first. The checks
// that several sections share live here: ranges, choices, names, TCP
// addresses, and one table of the sockets the sections will bind, so that
// two sections cannot claim the same one.
package check

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Problem is one thing wrong in a configuration: where, and what would be right.
type Problem struct {
	Path string // key path such as listeners[1].address; empty for the whole file
	Msg  string
}

// Checker collects the problems of one configuration. It is not safe for
// concurrent use.
type Checker struct {
	lines    map[string]int // key path -> line it was written on
	fromFile bool
	problems []Problem
	warnings []Problem
	bound    []boundAddr
}

// New returns a Checker for a configuration whose keys were written on
// lines (key path -> line); fromFile is false for one built in code, which
// has no lines and whose keys are then named without "(by default)".
func New(lines map[string]int, fromFile bool) *Checker {
	return &Checker{lines: lines, fromFile: fromFile}
}

// Problems returns what was reported, in the order it was.
func (k *Checker) Problems() []Problem { return k.problems }

// Warnings returns what was warned about, in the order it was.
func (k *Checker) Warnings() []Problem { return k.warnings }

// Warn reports at path something valid that the user should know is
// dangerous, such as anonymous access from the network: the configuration
// runs, but fieldgate check and the start log say so.
func (k *Checker) Warn(path, format string, args ...any) {
	k.warnings = append(k.warnings, Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// Fail reports a problem at path.
func (k *Checker) Fail(path, format string, args ...any) {
	k.problems = append(k.problems, Problem{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// Written reports whether the file set path itself, not just a key above it.
func (k *Checker) Written(path string) bool {
	_, ok := k.lines[path]
	return ok
}

// Where names path for a message about another key, with its line when it
// was written in the file.
func (k *Checker) Where(path string) string {
	if l, ok := k.lines[path]; ok {
		return fmt.Sprintf("%s (line %d)", path, l)
	}
	if k.fromFile {
		return path + " (by default)"
	}
	return path
}

// Either picks the key a problem with two keys together is reported at:
// first, unless only second was written in the file, whose line is then
// the one to point at.
func (k *Checker) Either(first, second string) string {
	if !k.Written(first) && k.Written(second) {
		return second
	}
	return first
}

// IntRange reports n unless lo <= n <= hi; example is a good value to show.
func (k *Checker) IntRange(path string, n, lo, hi int, example string) {
	if n < lo || n > hi {
		k.Fail(path, "%d is out of range; use %d to %d, such as %s", n, lo, hi, example)
	}
}

// OneOf reports got unless it is one of allowed.
func (k *Checker) OneOf(path, got string, allowed ...string) {
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	k.Fail(path, "%q is not allowed; use one of %s", got, strings.Join(allowed, ", "))
}

// maxNameLen bounds names. A sensor's name is a level of each of its
// topics, which MQTT caps at 65535 bytes together, and of Home Assistant's
// entity ids; 64 characters are more than any site needs.
const maxNameLen = 64

// Name checks the name of a listener, sensor, output, channel, bridge or
// gateway. Names become log fields, metric labels and (for sensors) MQTT
// topic levels, so they are kept to characters that are safe in all
// three; seen maps the names of one namespace to the path that first used
// them.
func (k *Checker) Name(path, name string, seen map[string]string) {
	if name == "" {
		k.Fail(path, "required: a short unique name such as %q", "greenhouse-1")
		return
	}
	if len(name) > maxNameLen {
		k.Fail(path, "is %d characters long; use at most %d, such as %q", len(name), maxNameLen, "greenhouse-1")
		return
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			k.Fail(path, "%q contains %q; use letters, digits, - and _", name, r)
			return
		}
	}
	if first, dup := seen[name]; dup {
		k.Fail(path, "%q is already the name of %s; names must be unique", name, k.Where(strings.TrimSuffix(first, ".name")))
		return
	}
	seen[name] = path
}

// HostPort checks a TCP address and reports whether it is usable; example
// is a correct address to show.
func (k *Checker) HostPort(path, addr, example string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		k.Fail(path, "%q is not host:port; use something like %s, or :%s for every interface", addr, example, example[strings.LastIndex(example, ":")+1:])
		return false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		k.Fail(path, "port %q is not a number from 0 to 65535; use something like %s", port, example)
		return false
	}
	return true
}

// boundAddr is an address some listener or endpoint will bind.
type boundAddr struct {
	path    string
	network string // tcp or unix
	addr    string
}

// Claim records that path binds addr on network (tcp or unix), and reports
// it when a key claimed earlier already binds it. A wildcard host clashes
// with every host on the same port, as it does for bind(2) on Linux; port
// 0 (pick any free port) clashes with nothing.
func (k *Checker) Claim(path, network, addr string) {
	for _, b := range k.bound {
		if b.network == network && sameSocket(network, b.addr, addr) {
			if k.Either(path, b.path) == path {
				k.Fail(path, "%s is also bound by %s; give each its own address", addr, k.Where(b.path))
			} else {
				// Only the earlier one was written: a default clashes with it.
				k.Fail(b.path, "%s is also bound by %s; give each its own address", b.addr, k.Where(path))
			}
			return
		}
	}
	k.bound = append(k.bound, boundAddr{path, network, addr})
}

func sameSocket(network, a, b string) bool {
	if network == "unix" {
		return a == b
	}
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	if pa != pb || pa == "0" {
		return false
	}
	wild := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	return ha == hb || wild(ha) || wild(hb)
}
