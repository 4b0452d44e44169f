package auth

import (
	"strconv"
	"strings"

	"github.com/fieldgate/fieldgate/matcher"
)

// access is what a rule grants, or that it denies.
type access uint8

const (
	accessRead access = 1 << iota
	accessWrite
	accessDeny
)

// rule is a configured ACL rule, prepared.
type rule struct {
	user   string // "" for every client
	filter string // as configured, with %u and %c
	access access
	all    bool // denies every topic: a deny rule that could not be understood

	userVar   bool // the filter uses %u
	clientVar bool // the filter uses %c
}

// ACL is the broker's access control list. It is immutable, so any number of
// goroutines may use it at once; a reload builds a new one.
type ACL struct {
	open  bool // no rules: everything is allowed
	rules []rule
}

// NewACL prepares rules; with none, every client may do everything.
func NewACL(rules []ACLRule) *ACL {
	a := &ACL{open: len(rules) == 0}
	for _, r := range rules {
		p := rule{
			user:      r.User,
			filter:    r.Topic,
			userVar:   strings.Contains(r.Topic, "%u"),
			clientVar: strings.Contains(r.Topic, "%c"),
		}
		if p.user == "*" {
			p.user = ""
		}
		switch r.Access {
		case "read":
			p.access = accessRead
		case "write":
			p.access = accessWrite
		case "readwrite":
			p.access = accessRead | accessWrite
		case "deny":
			p.access = accessDeny
		default:
			// Fail closed: the rule may have been meant to deny.
			p.access, p.all = accessDeny, true
		}
		// Check the filter as configuration validation does, with
		// stand-ins for the variables.
		standIn := strings.NewReplacer("%u", "u", "%c", "c").Replace(r.Topic)
		if matcher.ValidateFilter(standIn) != nil {
			if p.access != accessDeny {
				continue
			}
			p.all = true
		}
		a.rules = append(a.rules, p)
	}
	return a
}

// Permissions are what an ACL lets one client do: the rules that apply to it,
// with %u and %c substituted. The zero value allows nothing.
type Permissions struct {
	open   bool
	grants []grant
}

type grant struct {
	filter string
	access access
	all    bool
}

// For returns the permissions of the client with this username (empty
// for none) and client id. A broker keeps them for the life of a connection,
// so checks per message substitute nothing and allocate nothing, and asks
// the new ACL after a reload. A nil ACL allows everything, as one without
// rules does.
func (a *ACL) For(user, clientID string) Permissions {
	if a == nil || a.open {
		return Permissions{open: true}
	}
	var p Permissions
	for i := range a.rules {
		r := &a.rules[i]
		if r.user != "" && r.user != user {
			continue
		}
		f, ok := r.filter, true
		if !r.all {
			f, ok = r.expand(user, clientID)
		}
		if ok {
			p.grants = append(p.grants, grant{filter: f, access: r.access, all: r.all})
		}
	}
	return p
}

// expand substitutes the username and client id into the rule's filter. It
// reports false when the rule does not apply: a value it needs is empty, or
// would widen the filter.
func (r *rule) expand(user, clientID string) (string, bool) {
	if !r.userVar && !r.clientVar {
		return r.filter, true
	}
	if r.userVar && !substitutable(user) || r.clientVar && !substitutable(clientID) {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(r.filter) + len(user) + len(clientID))
	f := r.filter
	for {
		i := strings.IndexByte(f, '%')
		if i < 0 || i+1 == len(f) {
			b.WriteString(f)
			break
		}
		b.WriteString(f[:i])
		switch f[i+1] {
		case 'u':
			b.WriteString(user)
			f = f[i+2:]
		case 'c':
			b.WriteString(clientID)
			f = f[i+2:]
		default:
			b.WriteByte('%')
			f = f[i+1:]
		}
	}
	out := b.String()
	// A value beginning with '$' must not move the rule into the
	// server's topics, such as $SYS.
	if strings.HasPrefix(out, "$") && !strings.HasPrefix(r.filter, "$") {
		return "", false
	}
	return out, true
}

// substitutable reports whether a username or client id may stand in a
// filter without widening it: a wildcard or a level separator would.
func substitutable(v string) bool {
	return v != "" && !strings.ContainsAny(v, "+#/")
}

// CanPublish reports whether the client may publish to topic.
func (p Permissions) CanPublish(topic string) bool { return p.allows(topic, accessWrite) }

// CanRead reports whether a message on topic may be delivered to the client.
func (p Permissions) CanRead(topic string) bool { return p.allows(topic, accessRead) }

func (p Permissions) allows(topic string, want access) bool {
	if p.open {
		return true
	}
	ok := false
	for _, g := range p.grants {
		switch {
		case g.access == accessDeny:
			if g.all || matcher.Matches(g.filter, topic) {
				return false
			}
		case !ok && g.access&want != 0:
			ok = matcher.Matches(g.filter, topic)
		}
	}
	return ok
}

// Grant is what the ACL decides for one subscription.
type Grant uint8

const (
	// Refused: the filter matches no topic the client may read.
	Refused Grant = iota
	// Checked: granted, but some topics the filter matches may not be
	// read, so each message is checked with CanRead before delivery.
	Checked
	// Covered: granted, and one read rule covers every topic the filter
	// matches while no deny rule reaches any of them: delivery needs no
	// check.
	Covered
)

// Subscribe decides a subscription to filter, as Mosquitto does: it is
// granted when some read rule allows some topic the filter matches, and
// each message is then checked at delivery unless the subscription is
// Covered. So one deny rule (secrets/#) leaves "#" subscribable, and the
// deny holds per message. A shared subscription is judged by the filter
// after $share/{group}/.
func (p Permissions) Subscribe(filter string) Grant {
	if _, inner, shared := matcher.SplitShared(filter); shared {
		filter = inner
	}
	if p.open {
		return Covered
	}
	if filter == "" {
		return Refused
	}
	readable, covered, denied := false, false, false
	for _, g := range p.grants {
		switch {
		case g.access == accessDeny:
			if g.all || matcher.Covers(g.filter, filter) {
				return Refused
			}
			denied = denied || matcher.Overlaps(g.filter, filter)
		case g.access&accessRead != 0 && !covered:
			if matcher.Covers(g.filter, filter) {
				readable, covered = true, true
			} else if !readable {
				readable = matcher.Overlaps(g.filter, filter)
			}
		}
	}
	switch {
	case !readable:
		return Refused
	case covered && !denied:
		return Covered
	}
	return Checked
}

// CanSubscribe reports whether the client may subscribe to filter: some
// topic it matches may be read (see Subscribe).
func (p Permissions) CanSubscribe(filter string) bool { return p.Subscribe(filter) != Refused }

// Open reports whether the permissions allow everything: the ACL has no
// rules, so nothing a client holds needs checking.
func (p Permissions) Open() bool { return p.open }

// CanPublish reports whether the client may publish to topic.
func (a *ACL) CanPublish(user, clientID, topic string) bool {
	return a.For(user, clientID).CanPublish(topic)
}

// CanSubscribe reports whether the client may subscribe to filter.
func (a *ACL) CanSubscribe(user, clientID, filter string) bool {
	return a.For(user, clientID).CanSubscribe(filter)
}

// CanRead reports whether a message on topic may be delivered to the client.
func (a *ACL) CanRead(user, clientID, topic string) bool {
	return a.For(user, clientID).CanRead(topic)
}

// String names the decision, for logs and test failures.
func (g Grant) String() string {
	switch g {
	case Refused:
		return "refused"
	case Checked:
		return "checked"
	case Covered:
		return "covered"
	}
	return "Grant(" + strconv.Itoa(int(g)) + ")"
}
