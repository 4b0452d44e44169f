package broker

import (
	"strings"
	"sync"

	"github.com/fieldgate/fieldgate/matcher"
)

// retainedStore holds the last retained message of every topic in memory.
// A filter without wildcards is a direct lookup; a wildcard filter is
// checked against every retained topic, which is fine for the hundreds a
// gateway holds. The storage package replaces this with a prefix seek.
type retainedStore struct {
	mu     sync.RWMutex
	topics map[string]*message
}

func (r *retainedStore) init() { r.topics = make(map[string]*message) }

func (r *retainedStore) set(m *message) {
	r.mu.Lock()
	r.topics[m.topic] = m
	r.mu.Unlock()
}

func (r *retainedStore) delete(topic string) {
	r.mu.Lock()
	delete(r.topics, topic)
	r.mu.Unlock()
}

func (r *retainedStore) len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return len(r.topics)
}

// match calls fn for every retained message whose topic filter matches.
// fn runs without the store's lock held.
func (r *retainedStore) match(filter string, fn func(*message)) {
	var found []*message
	r.mu.RLock()
	if !strings.ContainsAny(filter, "+#") {
		if m := r.topics[filter]; m != nil {
			found = append(found, m)
		}
	} else {
		for t, m := range r.topics {
			if matcher.Matches(filter, t) {
				found = append(found, m)
			}
		}
	}
	r.mu.RUnlock()
	for _, m := range found {
		fn(m)
	}
}
