package broker

import (
	"log/slog"
	"strings"
	"sync"

	"github.com/fieldgate/fieldgate/matcher"
	"github.com/fieldgate/fieldgate/storage"
)

// retainedStore holds the last retained message of every topic in memory.
// A filter without wildcards is a direct lookup; a wildcard filter is
// checked against every retained topic, which is fine for the hundreds a
// gateway holds. The storage package replaces this with a prefix seek.
type retainedStore struct {
	mu     sync.RWMutex
	topics map[string]*message // $ topics always; every topic without storage
	db     *storage.DB
	log    *slog.Logger
}

// stored reports whether topic's retained message lives in storage:
// everything but the broker's own $ topics, which are rewritten every few
// seconds and not worth an SD card's wear.
func (r *retainedStore) stored(topic string) bool {
	return r.db != nil && !strings.HasPrefix(topic, "$")
}

func (r *retainedStore) init() { r.topics = make(map[string]*message) }

// set stores m as its topic's retained message: in fx's batch when it
// goes to storage (and fx is given), else in memory.
func (r *retainedStore) set(m *message, fx *effects) {
	if r.stored(m.topic) {
		if fx != nil {
			fx.batch.SetRetained(storedMessage(m))
		}
		return
	}
	r.mu.Lock()
	r.topics[m.topic] = m
	r.mu.Unlock()
}

func (r *retainedStore) delete(topic string, fx *effects) {
	if r.stored(topic) {
		if fx != nil {
			fx.batch.DeleteRetained(topic)
		}
		return
	}
	r.mu.Lock()
	delete(r.topics, topic)
	r.mu.Unlock()
}

func (r *retainedStore) len() int {
	r.mu.RLock()
	n := len(r.topics)
	r.mu.RUnlock()
	if r.db != nil {
		n += r.db.RetainedCount()
	}
	return n
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
	if r.db == nil {
		return
	}
	// The stored ones are read from the file on each subscribe, so the
	// broker holds no second copy of every retained payload.
	err := r.db.MatchRetained(filter, matcher.Matches, func(sm *storage.Message) {
		if m, err := messageFromStored(sm); err == nil {
			fn(m)
		}
	})
	if err != nil {
		r.log.Warn("reading retained messages failed", "filter", filter, "err", err)
	}
}
