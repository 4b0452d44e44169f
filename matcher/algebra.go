package matcher

import "strings"

// Filter algebra: questions about two filters as sets of topics, answered
// level by level without listing any topic. The broker's ACL asks whether a
// rule covers a subscription and whether a deny rule overlaps it; the bridge
// asks whether two in-routes may receive the same message.
//
// A filter stands for the valid topic names Matches accepts for it. Two
// rules of MQTT make that set more than the level-by-level picture: a
// filter whose first level is '+' or '#' matches no topic beginning with
// '$' [MQTT-4.7.2-1], and no topic name is empty [MQTT-4.7.3-1], so the
// parent level "/#" would match is no topic: "/#" matches what "/+/#"
// matches, "#" what "+/#" matches, and "+" and "/#" share no topic.
//
// Like Matches, both functions take valid filters (ValidateFilter) as
// written: a shared subscription's "$share/{group}/" prefix is compared as
// two literal levels. To ask about the messages a shared subscription
// receives, pass the filter after its group, as SplitShared returns it.

// Overlaps reports whether some valid topic name matches both filter a and
// filter b. It is symmetric and exact: "a/+" and "+/b" overlap ("a/b"),
// "a/#" and "a" overlap ("a"), "#" and "$SYS/#" do not [MQTT-4.7.2-1], nor
// do "+" and "/#", whose only common topic would be the empty one.
func Overlaps(a, b string) bool {
	if wildStart(a) && dollarStart(b) || wildStart(b) && dollarStart(a) {
		return false
	}
	for first := true; ; first = false {
		x, aRest, aMore := strings.Cut(a, "/")
		y, bRest, bMore := strings.Cut(b, "/")
		switch {
		case x == "#" || y == "#":
			// The other filter's topics that continue the common
			// levels so far all match: "#" takes any remainder. The
			// first level has passed the '$' check above.
			return true
		case x != y && x != "+" && y != "+":
			return false
		}
		switch {
		case aMore && bMore:
			a, b = aRest, bRest
			continue
		case aMore && aRest != "#", bMore && bRest != "#":
			// One filter ends here; the other needs another level
			// unless only a '#', which also matches its parent, follows.
			return false
		}
		// The common topic ends at this level. If it is the first, the
		// topic is that one level, which must not be empty: a literal
		// empty level makes it the empty topic, while two '+' can take
		// any level.
		return !first || x != "" && y != ""
	}
}

// Covers reports whether filter a matches every valid topic name that
// filter b matches: a subscription to b receives nothing a rule for a does
// not allow. It is exact, so Covers(a, b) && Covers(b, a) means a and b
// match the same topics, as "#" and "+/#" do. Every filter covers itself;
// "#" covers every filter that does not begin with '$'; no filter beginning
// with a wildcard covers one beginning with '$' [MQTT-4.7.2-1]. A valid
// filter matches at least one topic, so Covers(a, b) implies Overlaps(a, b).
func Covers(a, b string) bool {
	if wildStart(a) && dollarStart(b) {
		return false
	}
	// No topic is empty, so a '#' after an empty first level, or as the
	// first level, matches what it would after one level more; written
	// that way, the parent a '#' matches is always a topic.
	switch b {
	case "#":
		b = "+/#"
	case "/#":
		b = "/+/#"
	}
	for {
		x, aRest, aMore := strings.Cut(a, "/")
		y, bRest, bMore := strings.Cut(b, "/")
		switch {
		case x == "#":
			return true
		case y == "#":
			// b matches its parent level, a topic that ends before the
			// level a still asks for.
			return false
		case x != y && x != "+":
			return false
		}
		switch {
		case aMore && bMore:
			a, b = aRest, bRest
		case aMore:
			// b's topics end here; a reaches back to them only through
			// a '#' that also matches its parent.
			return aRest == "#"
		case bMore:
			// b's topics go deeper (those of "x/#" too), a's end here.
			return false
		default:
			return true
		}
	}
}

// wildStart reports whether a filter's first level is a wildcard.
func wildStart(filter string) bool {
	return filter != "" && (filter[0] == '+' || filter[0] == '#')
}

// dollarStart reports whether a topic or filter begins with '$', like the
// server's own topics ($SYS/...).
func dollarStart(s string) bool {
	return s != "" && s[0] == '$'
}
