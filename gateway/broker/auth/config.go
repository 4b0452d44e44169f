package auth

import (
	"strings"

	"github.com/fieldgate/fieldgate/internal/check"
	"github.com/fieldgate/fieldgate/matcher"
)

// ACLRule allows (or denies) one user's clients access to the topics one
// filter matches: an item of the configuration file's broker.acl list.
type ACLRule struct {
	User   string `yaml:"user"`   // the username it applies to; empty or * for every client
	Topic  string `yaml:"topic"`  // a topic filter; %u is replaced by the username, %c by the client id
	Access string `yaml:"access"` // read, write, readwrite or deny
}

// Check reports the rule's problems to k, under path (broker.acl[i]).
func (r ACLRule) Check(k *check.Checker, path string) {
	k.OneOf(path+".access", r.Access, "read", "write", "readwrite", "deny")
	if r.Topic == "" {
		k.Fail(path+".topic", "required: a topic filter such as sensors/%%u/#")
		return
	}
	// %u and %c stand for one whole level's worth of text; check the
	// filter with a stand-in so that a typo is caught at load time.
	f := strings.NewReplacer("%u", "user", "%c", "client").Replace(r.Topic)
	if err := matcher.ValidateFilter(f); err != nil {
		k.Fail(path+".topic", "%q is not a valid topic filter: %v", r.Topic, err)
	}
}
