package auth

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/matcher"
)

// fuzzHash is a well-formed bcrypt hash at the lowest cost, for entries the
// fuzz targets write.
const fuzzHash = "$2a$04$" + dummyTail

// FuzzPasswordFile parses arbitrary text as a password file, as the broker
// does at start and on reload. It must not panic. A refusal is a
// *FileError whose problems name lines of the file, in order; an accepted
// file holds one user per entry line, each a username ValidateUsername
// accepts with a hash checkHash accepts. Setting a password in an accepted
// file (as fieldgate passwd does) must leave a file that parses to the
// same users plus that one, and deleting the user again to the same users
// without it.
//
//	go test -run '^$' -fuzz FuzzPasswordFile -fuzztime 15s ./gateway/broker/auth
func FuzzPasswordFile(f *testing.F) {
	for _, s := range []struct{ file, user string }{
		{"", "alice"},
		{"alice:" + fuzzHash + "\n", "alice"},
		{"# users\n\nalice:" + fuzzHash + "\r\nbob:" + fuzzHash, "carol"},
		{"alice:" + fuzzHash + "\nalice:" + fuzzHash + "\n", "bob"},
		{"alice\n", "alice"},
		{":" + fuzzHash + "\n", "x"},
		{"#alice:" + fuzzHash + "\n", "#alice"},
		{"alice:$2a$31$" + dummyTail + "\n", "alice"},
		{"alice:$2a$15$" + dummyTail + "\n", "alice"},
		{"alice:$2x$10$" + dummyTail + "\n", "alice"},
		{"al\x00ice:" + fuzzHash + "\n", "al\tice"},
		{"\xff:" + fuzzHash + "\n", "bob"},
		{"alice:" + fuzzHash + " \t\n", "alice"},
		{"alice:" + fuzzHash + "\rbob:" + fuzzHash + "\n", "bob"},
	} {
		f.Add([]byte(s.file), s.user)
	}
	f.Fuzz(func(t *testing.T, data []byte, user string) {
		p, err := parsePasswords("passwd", data)
		lines := 1 + strings.Count(string(data), "\n")
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) || len(fe.Problems) == 0 {
				t.Fatalf("error %v (%T) is not a *FileError with problems", err, err)
			}
			last := 0
			for _, pr := range fe.Problems {
				if pr.File != "passwd" || pr.Line < 1 || pr.Line > lines || pr.Line <= last || pr.Msg == "" {
					t.Fatalf("problem %q: want file passwd, a line of its %d after line %d, a message", pr, lines, last)
				}
				last = pr.Line
			}
			return
		}
		entries := 0
		for _, line := range strings.Split(string(data), "\n") {
			if _, _, isEntry, _ := splitEntry(line); isEntry {
				entries++
			}
		}
		if p.Len() != entries {
			t.Fatalf("%d users from %d entry lines", p.Len(), entries)
		}
		for u, h := range p.users {
			if err := ValidateUsername(u); err != nil {
				t.Fatalf("accepted user %q: %v", u, err)
			}
			if _, why := checkHash(h); why != "" {
				t.Fatalf("accepted hash %q of %q: %s", h, u, why)
			}
		}
		if ValidateUsername(user) != nil {
			return
		}

		path := filepath.Join(t.TempDir(), "passwd")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := rewrite(path, user, user+":"+fuzzHash); err != nil {
			t.Fatalf("setting %q: %v", user, err)
		}
		want := maps.Clone(p.users)
		want[user] = fuzzHash
		fuzzWantUsers(t, path, want, "after setting "+user)
		if err := rewrite(path, user, ""); err != nil {
			t.Fatalf("deleting %q: %v", user, err)
		}
		delete(want, user)
		fuzzWantUsers(t, path, want, "after deleting "+user)
	})
}

// fuzzWantUsers requires the password file at path to parse to want.
func fuzzWantUsers(t *testing.T, path string, want map[string]string, when string) {
	t.Helper()
	got, err := LoadPasswords(path)
	if err != nil {
		t.Fatalf("%s: the file no longer parses: %v", when, err)
	}
	if !maps.Equal(got.users, want) {
		t.Fatalf("%s: users %v, want %v", when, got.users, want)
	}
}

// fuzzACLReader turns fuzz bytes into ACL rules, names and topics, so that
// most inputs are rules of the shapes that matter: variables, wildcards,
// $ topics, empty levels, and now and then a raw byte.
type fuzzACLReader struct{ b []byte }

func (r *fuzzACLReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzACLReader) pick(from []string) string {
	c := r.byte()
	if int(c) < len(from) || c < 0xF0 {
		return from[int(c)%len(from)]
	}
	return string([]byte{r.byte()})
}

var (
	fuzzACLLevels = []string{"a", "b", "", "+", "#", "%u", "%c", "$SYS", "x%uy", "%", "%%u", "$share"}
	fuzzACLUsers  = []string{"", "*", "alice", "bob"}
	fuzzACLAccess = []string{"read", "write", "readwrite", "deny", "all"}
	fuzzACLNames  = []string{"alice", "bob", "", "a+b", "x/y", "#", "$SYS", "dev-1", "%u"}
	fuzzTopicBits = []string{"a", "b", "", "$SYS", "alice", "dev-1", "z"}
)

// filter decodes one to four levels joined by '/'.
func (r *fuzzACLReader) filter(levels []string) string {
	n := 1 + int(r.byte())%4
	parts := make([]string, n)
	for i := range parts {
		parts[i] = r.pick(levels)
	}
	return strings.Join(parts, "/")
}

// fuzzTopics returns topics that filter matches, made by filling its
// wildcards in several ways, plus the filter itself.
func fuzzTopics(filter string) []string {
	if _, inner, ok := matcher.SplitShared(filter); ok {
		filter = inner
	}
	out := []string{filter}
	for _, plus := range []string{"a", "", "$SYS", "alice"} {
		for _, hash := range []string{"", "/z", "/z/y"} {
			t := strings.ReplaceAll(filter, "+", plus)
			switch {
			case t == "#":
				t = strings.TrimPrefix(hash, "/")
			case strings.HasSuffix(t, "/#"):
				t = strings.TrimSuffix(t, "/#") + hash
			}
			out = append(out, t)
		}
	}
	return out
}

// FuzzACL builds an ACL from arbitrary rules and asks it about arbitrary
// clients, filters and topics. It must not panic, and:
//
//   - a subscription delivered without a check per message (Covered)
//     matches no topic CanRead refuses, and a Refused one none it allows;
//   - a rule whose access is not understood denies its user everything;
//   - with no rules everything is allowed;
//   - the per-connection Permissions agree with the one-off questions.
//
// Run it with:
//
//	go test -run '^$' -fuzz FuzzACL -fuzztime 15s ./gateway/broker/auth
func FuzzACL(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 1, 5, 0, 0, 2, 1, 0, 1, 3, 0})
	f.Add([]byte{2, 0, 2, 5, 4, 2, 3, 0, 3, 0, 3, 3, 1, 2, 0, 3})
	f.Add([]byte{1, 2, 3, 7, 3, 4, 1, 1, 2, 1, 1, 3, 6, 3, 4})
	f.Add([]byte{3, 1, 1, 3, 0, 1, 4, 8, 5, 2, 3, 1, 0, 4, 0, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzACLReader{b: data}
		rules := make([]ACLRule, int(r.byte())%5)
		for i := range rules {
			rules[i] = ACLRule{User: r.pick(fuzzACLUsers), Topic: r.filter(fuzzACLLevels), Access: r.pick(fuzzACLAccess)}
		}
		a := NewACL(rules)
		for len(r.b) > 0 {
			user, client := r.pick(fuzzACLNames), r.pick(fuzzACLNames)
			filter := r.filter([]string{"a", "+", "#", "$SYS", "", "alice", "dev-1", "b"})
			if r.byte()&1 == 1 {
				filter = "$share/g/" + filter
			}
			p := a.For(user, client)
			grant := p.Subscribe(filter)
			if (grant != Refused) != a.CanSubscribe(user, client, filter) {
				t.Fatalf("CanSubscribe(%q) differs between the forms", filter)
			}
			for _, topic := range append(fuzzTopics(filter), r.filter(fuzzTopicBits)) {
				canRead, canPub := p.CanRead(topic), p.CanPublish(topic)
				if canRead != a.CanRead(user, client, topic) || canPub != a.CanPublish(user, client, topic) {
					t.Fatalf("the per-connection form differs on %q", topic)
				}
				if len(rules) == 0 && !(canRead && canPub) {
					t.Fatalf("with no rules, %q is refused", topic)
				}
				_, inner, shared := matcher.SplitShared(filter)
				if !shared {
					inner = filter
				}
				if matcher.ValidateFilter(filter) == nil && matcher.ValidateTopic(topic) == nil && matcher.Matches(inner, topic) {
					if grant == Covered && !canRead {
						t.Fatalf("rules %+v: user %q client %q: %q is Covered but %q may not be read", rules, user, client, filter, topic)
					}
					if grant == Refused && canRead {
						t.Fatalf("rules %+v: user %q client %q: %q is Refused but %q may be read", rules, user, client, filter, topic)
					}
				}
				for _, rl := range rules {
					if rl.User != "" && rl.User != "*" && rl.User != user {
						continue
					}
					if !map[string]bool{"read": true, "write": true, "readwrite": true, "deny": true}[rl.Access] && (canRead || canPub) {
						t.Fatalf("rule %+v is not understood, yet %q may read or publish %q", rl, user, topic)
					}
				}
			}
		}
	})
}
