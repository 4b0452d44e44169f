package auth

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/fieldgate/fieldgate/matcher"
)

// op is one kind of ACL question.
type op int

const (
	pub op = iota
	sub
	read
	cov // the subscription is Covered: no check per message
)

func (o op) String() string {
	return [...]string{"CanPublish", "CanSubscribe", "CanRead", "Subscribe==Covered"}[o]
}

func ask(a *ACL, o op, user, clientID, arg string) bool {
	switch o {
	case pub:
		return a.CanPublish(user, clientID, arg)
	case sub:
		return a.CanSubscribe(user, clientID, arg)
	case cov:
		return a.For(user, clientID).Subscribe(arg) == Covered
	default:
		return a.CanRead(user, clientID, arg)
	}
}

type aclCase struct {
	name           string
	o              op
	user, clientID string
	arg            string
	want           bool
}

func runACL(t *testing.T, a *ACL, cases []aclCase) {
	t.Helper()
	for _, c := range cases {
		if got := ask(a, c.o, c.user, c.clientID, c.arg); got != c.want {
			t.Errorf("%s: %v(user %q, client %q, %q) = %v, want %v", c.name, c.o, c.user, c.clientID, c.arg, got, c.want)
		}
		// The per-connection form must agree with the one-off form.
		p := a.For(c.user, c.clientID)
		var got bool
		switch c.o {
		case pub:
			got = p.CanPublish(c.arg)
		case sub:
			got = p.CanSubscribe(c.arg)
		case cov:
			got = p.Subscribe(c.arg) == Covered
		default:
			got = p.CanRead(c.arg)
		}
		if got != c.want {
			t.Errorf("%s: Permissions.%v(%q) = %v, want %v", c.name, c.o, c.arg, got, c.want)
		}
	}
}

var plantRules = []ACLRule{
	{User: "", Topic: "public/#", Access: "read"},
	{User: "*", Topic: "public/secret/#", Access: "deny"},
	{User: "*", Topic: "devices/%c/#", Access: "readwrite"},
	{User: "", Topic: "users/%u/#", Access: "readwrite"},
	{User: "", Topic: "home/%u/%c", Access: "write"},
	{User: "admin", Topic: "#", Access: "readwrite"},
	{User: "admin", Topic: "$SYS/#", Access: "read"},
	{User: "admin", Topic: "vault/#", Access: "deny"},
	{User: "all", Topic: "#", Access: "readwrite"},
	{User: "sensor", Topic: "site/+/temp", Access: "write"},
	{User: "viewer", Topic: "site/+/temp", Access: "read"},
	{User: "viewer", Topic: "site/b/#", Access: "deny"},
	{User: "", Topic: "dev-%u/x", Access: "read"},
	{User: "", Topic: "%u/own/#", Access: "readwrite"},
}

func TestACL(t *testing.T) {
	a := NewACL(plantRules)
	runACL(t, a, []aclCase{
		// Read-only rules and deny precedence.
		{"anonymous reads public", read, "", "c1", "public/news", true},
		{"anonymous may not publish public", pub, "", "c1", "public/news", false},
		{"anonymous subscribes below public", sub, "", "c1", "public/news/#", true},
		{"exact subscription", sub, "", "c1", "public/news", true},
		{"deny wins over read", read, "", "c1", "public/secret/plan", false},
		{"deny covers its parent", read, "", "c1", "public/secret", false},
		{"subscription overlapping a deny is granted", sub, "", "c1", "public/#", true},
		{"…and checked per message", cov, "", "c1", "public/#", false},
		{"+ reaching the denied parent is granted", sub, "", "c1", "public/+", true},
		{"…and checked", cov, "", "c1", "public/+", false},
		{"+ one level deeper overlaps the deny too", cov, "", "c1", "public/+/x", false},
		{"subscription clear of the deny", sub, "", "c1", "public/news/+", true},
		{"…needs no check", cov, "", "c1", "public/news/+", true},
		{"a deny covering the filter refuses it", sub, "", "c1", "public/secret/#", false},
		{"…and a filter below it", sub, "", "c1", "public/secret/a/+", false},
		{"nothing allows it", read, "", "c1", "private/x", false},
		{"nothing allows the subscription", sub, "", "c1", "private/#", false},

		// %c.
		{"own device topic", pub, "", "dev1", "devices/dev1/up", true},
		{"own device subscription", sub, "", "dev1", "devices/dev1/#", true},
		{"another device's topic", pub, "", "dev1", "devices/dev2/up", false},
		{"a wildcard over devices is granted for the own device", sub, "", "dev1", "devices/+/up", true},
		{"…and checked, so others' topics are withheld", cov, "", "dev1", "devices/+/up", false},
		{"another device's subscription", sub, "", "dev1", "devices/dev2/#", false},
		{"client id + does not widen", sub, "", "+", "devices/+/#", false},
		{"client id + gets nothing", pub, "", "+", "devices/x/up", false},
		{"client id # does not widen", read, "", "#", "devices/x", false},
		{"client id with / does not reach deeper", pub, "", "a/b", "devices/a/b/up", false},
		{"client id with / and its own literal prefix", pub, "", "a/b", "devices/a/up", false},
		{"empty client id", pub, "", "", "devices//up", false},

		// %u.
		{"own user topic", pub, "bob", "c", "users/bob/x", true},
		{"other user's topic", read, "bob", "c", "users/alice/x", false},
		{"anonymous gets no %u rule", pub, "", "c", "users//x", false},
		{"anonymous subscription via %u rule", sub, "", "c", "users//#", false},
		{"username + does not widen", sub, "+", "c", "users/+/#", false},
		{"username with / does not reach deeper", pub, "bob/x", "c", "users/bob/x/y", false},
		{"%u and %c together", pub, "bob", "kitchen", "home/bob/kitchen", true},
		{"%u and %c, wrong client", pub, "bob", "hall", "home/bob/kitchen", false},
		{"%u and %c, anonymous", pub, "", "kitchen", "home//kitchen", false},
		{"%u inside a level", read, "bob", "c", "dev-bob/x", true},
		{"%u inside a level, anonymous", read, "", "c", "dev-/x", false},
		{"%u inside a level, $ is harmless", read, "$x", "c", "dev-$x/x", true},
		{"%u at the start", pub, "bob", "c", "bob/own/a", true},
		{"%u at the start may not reach $SYS", read, "$SYS", "c", "$SYS/own/x", false},
		{"%u at the start may not subscribe $SYS", sub, "$SYS", "c", "$SYS/own/#", false},
		{"a username holding %c is not substituted again", pub, "%c", "zz", "users/%c/x", true},
		{"…nor does it become the client id", pub, "%c", "zz", "users/zz/x", false},

		// Users, # and $SYS.
		{"admin publishes anywhere", pub, "admin", "c", "site/a/temp", true},
		{"admin subscribes widely", sub, "admin", "c", "site/#", true},
		{"admin's deny", pub, "admin", "c", "vault/key", false},
		{"admin's # overlapping the deny is granted", sub, "admin", "c", "#", true},
		{"…and checked", cov, "admin", "c", "#", false},
		{"admin's site/# is covered", cov, "admin", "c", "site/#", true},
		{"admin's $SYS rule", sub, "admin", "c", "$SYS/#", true},
		{"admin reads $SYS", read, "admin", "c", "$SYS/broker/uptime", true},
		{"# alone does not reach $SYS", sub, "all", "c", "$SYS/#", false},
		{"# alone does not read $SYS", read, "all", "c", "$SYS/broker/uptime", false},
		{"# alone does not publish $SYS", pub, "all", "c", "$SYS/x", false},
		{"# is granted though a deny for everyone overlaps it", sub, "all", "c", "#", true},
		{"…and checked", cov, "all", "c", "#", false},
		{"# covers +/x", sub, "all", "c", "+/x", true},
		{"every-client rules apply to named users", read, "bob", "c", "public/news", true},
		{"user rules are exact", pub, "Admin", "c", "site/a/temp", false},

		// Writers and readers of one pattern.
		{"sensor publishes", pub, "sensor", "c", "site/a/temp", true},
		{"sensor may not read", read, "sensor", "c", "site/a/temp", false},
		{"sensor may not subscribe", sub, "sensor", "c", "site/a/temp", false},
		{"viewer reads", read, "viewer", "c", "site/a/temp", true},
		{"viewer's deny", read, "viewer", "c", "site/b/temp", false},
		{"viewer subscribes one site", sub, "viewer", "c", "site/a/temp", true},
		{"viewer's + reaching the denied site is granted", sub, "viewer", "c", "site/+/temp", true},
		{"…and checked", cov, "viewer", "c", "site/+/temp", false},
		{"viewer's one site is covered", cov, "viewer", "c", "site/a/temp", true},
		{"viewer may not publish", pub, "viewer", "c", "site/a/temp", false},
		{"filter wider than the rule is granted", sub, "viewer", "c", "site/a/#", true},
		{"…and checked", cov, "viewer", "c", "site/a/#", false},
		{"viewer's filter clear of every read rule", sub, "viewer", "c", "site/a/hum", false},

		// Shared subscriptions are judged by their filter.
		{"shared, allowed", sub, "viewer", "c", "$share/g/site/a/temp", true},
		{"shared, denied", sub, "viewer", "c", "$share/g/site/b/temp", false},
		{"shared, overlapping the deny", sub, "viewer", "c", "$share/g/site/+/temp", true},
		{"shared, overlapping the deny, checked", cov, "viewer", "c", "$share/g/site/+/temp", false},
		{"shared, some topics readable", sub, "viewer", "c", "$share/g/#", true},
		{"shared, nothing readable", sub, "viewer", "c", "$share/g/site/a/hum", false},
		{"shared, no filter", sub, "admin", "c", "$share/g", false},
		{"shared %c", sub, "", "dev1", "$share/grp/devices/dev1/cmd", true},
	})
}

func TestACLOpen(t *testing.T) {
	for name, a := range map[string]*ACL{"no rules": NewACL(nil), "empty rules": NewACL([]ACLRule{}), "nil ACL": nil} {
		runACL(t, a, []aclCase{
			{name, pub, "", "", "any/topic", true},
			{name, sub, "", "", "#", true},
			{name, sub, "bob", "c", "$SYS/#", true},
			{name, sub, "bob", "c", "$share/g/a/+", true},
			{name, read, "bob", "c", "$SYS/x", true},
		})
	}
	var zero Permissions
	if zero.CanPublish("a") || zero.CanRead("a") || zero.CanSubscribe("a") {
		t.Error("zero Permissions allow something")
	}
}

func TestACLBadRules(t *testing.T) {
	a := NewACL([]ACLRule{
		{User: "*", Topic: "open/#", Access: "readwrite"},
		{User: "typo", Topic: "x/#", Access: "raed"},
		{User: "badfilter", Topic: "a/#/b", Access: "deny"},
		{User: "badallow", Topic: "b+/c", Access: "readwrite"},
		{User: "badallow", Topic: "", Access: "read"},
		{User: "bad%u", Topic: "%u/#", Access: "nonsense"},
	})
	runACL(t, a, []aclCase{
		{"unknown access denies its user everything", pub, "typo", "c", "open/x", false},
		{"… including subscriptions", sub, "typo", "c", "open/#", false},
		{"… only its user", pub, "other", "c", "open/x", true},
		{"invalid deny filter denies everything", read, "badfilter", "c", "open/x", false},
		{"invalid allow filter allows nothing", pub, "badallow", "c", "b+/c", false},
		{"… and takes nothing away", pub, "badallow", "c", "open/x", true},
		{"unknown access denies whatever the variables", sub, "bad%u", "c", "open/#", false},
	})
}

// TestACLSubscribeExactCover checks that a read rule covers a subscription
// (no check per message) matching no topic the rule does not, though the two filters differ level
// by level: no topic has zero levels and none is empty, so "+/#" matches
// every topic "#" does and "/+/#" every topic "/#" does.
func TestACLSubscribeExactCover(t *testing.T) {
	a := NewACL([]ACLRule{
		{User: "u", Topic: "+/#", Access: "read"},
		{User: "v", Topic: "/+/#", Access: "read"},
		{User: "w", Topic: "+/+/#", Access: "read"},
	})
	runACL(t, a, []aclCase{
		{"+/# covers #", cov, "u", "c", "#", true},
		{"… shared too", cov, "u", "c", "$share/g/#", true},
		{"+/# does not cover $SYS", cov, "u", "c", "$SYS/#", false},
		{"/+/# covers /#", cov, "v", "c", "/#", true},
		{"/+/# reads /", read, "v", "c", "/", true},
		{"+/+/# covers /#", cov, "w", "c", "/#", true},
		{"+/+/# does not cover #", cov, "w", "c", "#", false},
		{"+/+/# does not cover a/#", cov, "w", "c", "a/#", false},
	})
}

func TestACLConcurrent(t *testing.T) {
	a := NewACL(plantRules)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				user := []string{"", "bob", "admin", "viewer"}[(g+i)%4]
				p := a.For(user, "dev1")
				if p.CanRead("public/news") != a.CanRead(user, "dev1", "public/news") ||
					!p.CanSubscribe("devices/dev1/#") || p.CanPublish("public/secret/x") {
					t.Error("inconsistent answer under concurrency")
					return
				}
			}
		})
	}
	wg.Wait()
}

// Small alphabets make random filters and topics meet often. "$s" tests
// the rule that a leading wildcard does not match '$' topics, "" empty levels.
var (
	filterLevels = []string{"a", "b", "$s", "", "+"}
	topicLevels  = []string{"a", "b", "$s", "", "z"}
)

func randomFilter(r *rand.Rand) string {
	if r.IntN(10) == 0 {
		return "#"
	}
	n := 1 + r.IntN(3)
	levels := make([]string, 0, n+1)
	for range n {
		levels = append(levels, filterLevels[r.IntN(len(filterLevels))])
	}
	if r.IntN(3) == 0 {
		levels = append(levels, "#")
	}
	if f := strings.Join(levels, "/"); f != "" {
		return f
	}
	return randomFilter(r) // a single empty level is no filter
}

// allTopics lists every valid topic of up to depth levels from topicLevels.
func allTopics(depth int) []string {
	var out []string
	layer := []string{""}
	for d := 1; d <= depth; d++ {
		var next []string
		for _, prefix := range layer {
			for _, l := range topicLevels {
				t := l
				if d > 1 {
					t = prefix + "/" + l
				}
				next = append(next, t)
				if t != "" {
					out = append(out, t)
				}
			}
		}
		layer = next
	}
	return out
}

// randomRules draws rules over the same small alphabet, some with %u or %c,
// some denying.
func randomRules(r *rand.Rand) []ACLRule {
	accesses := []string{"read", "readwrite", "write", "deny"}
	users := []string{"", "*", "u"}
	rules := make([]ACLRule, 1+r.IntN(4))
	for i := range rules {
		f := randomFilter(r)
		switch r.IntN(5) {
		case 0:
			f = strings.Replace(f, "a", "%u", 1)
		case 1:
			f = strings.Replace(f, "b", "%c", 1)
		}
		rules[i] = ACLRule{User: users[r.IntN(len(users))], Topic: f, Access: accesses[r.IntN(len(accesses))]}
	}
	return rules
}

// TestSubscribeImpliesRead is the property the broker relies on: a
// subscription delivered without a check per message (Covered) lets
// through only what CanRead allows, and a refused one could have received
// nothing CanRead allows.
func TestSubscribeImpliesRead(t *testing.T) {
	topics := allTopics(4)
	clients := []struct{ user, clientID string }{
		{"u", "a"}, {"", "b"}, {"a", "b"}, {"+", "#"}, {"a/b", "a/b"}, {"$s", "$s"}, {"", ""},
	}
	r := rand.New(rand.NewPCG(3, 4))
	seen := map[Grant]int{}
	for range 400 {
		rules := randomRules(r)
		a := NewACL(rules)
		for _, c := range clients {
			p := a.For(c.user, c.clientID)
			for range 10 {
				f := randomFilter(r)
				g := p.Subscribe(f)
				seen[g]++
				readable := false
				for _, topic := range topics {
					if !matcher.Matches(f, topic) {
						continue
					}
					ok := p.CanRead(topic)
					readable = readable || ok
					if g == Covered && !ok {
						t.Fatalf("rules %+v, client %+v: %q is Covered but CanRead(%q) is false", rules, c, f, topic)
					}
				}
				if g == Refused && readable {
					t.Fatalf("rules %+v, client %+v: %q is Refused, yet a topic it matches may be read", rules, c, f)
				}
				if sg := p.Subscribe("$share/g/" + f); sg != g {
					t.Fatalf("rules %+v, client %+v: %q is %v but %v shared", rules, c, f, g, sg)
				}
			}
		}
	}
	for _, g := range []Grant{Refused, Checked, Covered} {
		if seen[g] < 100 {
			t.Errorf("only %d subscriptions were decided %v; the property was hardly tested", seen[g], g)
		}
	}
}

func BenchmarkPermissionsCanRead(b *testing.B) {
	p := NewACL(plantRules).For("viewer", "dev1")
	b.ReportAllocs()
	for b.Loop() {
		if !p.CanRead("site/a/temp") {
			b.Fatal("refused")
		}
	}
}

func BenchmarkPermissionsCanSubscribe(b *testing.B) {
	p := NewACL(plantRules).For("bob", "dev1")
	b.ReportAllocs()
	for b.Loop() {
		if !p.CanSubscribe("devices/dev1/#") {
			b.Fatal("refused")
		}
	}
}
