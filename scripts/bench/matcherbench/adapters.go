package matcherbench

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/fieldgate/fieldgate/matcher"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/nats-io/nats-server/v2/server/gsl"
)

// Impl is one subscription index behind a common interface.
type Impl interface {
	// Name is the short name used in benchmark names.
	Name() string
	// Subscribe adds session h's subscription to an MQTT filter.
	Subscribe(h uint32, filter string, qos byte)
	// Native converts an MQTT topic name into the form Match and MatchCount
	// take. It is called outside the timed loop.
	Native(topic string) string
	// Match appends to dst[:0] the sorted, deduplicated handles of the
	// sessions matching topic (given in Native form). Used for verification.
	Match(topic string, dst []uint32) []uint32
	// MatchCount does the least work the implementation needs to produce its
	// subscriber set for topic (Native form) and returns the size of that
	// set. This is the timed operation.
	MatchCount(topic string) int
}

// Implementation names.
const (
	ImplFieldgate = "fieldgate"
	ImplMochi     = "mochi"
	ImplNATS      = "nats"
)

// ImplNames lists every implementation, ours first.
var ImplNames = []string{ImplFieldgate, ImplMochi, ImplNATS}

// New returns an empty index of the named implementation, set up to use the
// workload's pre-computed strings.
func New(name string, w *Workload) Impl {
	switch name {
	case ImplFieldgate:
		return NewFieldgate()
	case ImplMochi:
		return NewMochi(w.ClientIDs)
	case ImplNATS:
		return NewNATS(w.NATSSubj, w.NATSTopic)
	}
	panic("matcherbench: unknown implementation " + name)
}

// Build creates the named index and subscribes every subscription of w.
func Build(name string, w *Workload) Impl {
	x := New(name, w)
	for _, s := range w.Subs {
		x.Subscribe(s.Handle, s.Filter, s.QoS)
	}
	return x
}

// ---- fieldgate ----

// Fieldgate adapts matcher.Index.
type Fieldgate struct {
	x *matcher.Index
	r matcher.Result
}

// NewFieldgate returns an empty fieldgate index.
func NewFieldgate() *Fieldgate { return &Fieldgate{x: matcher.NewIndex()} }

func (f *Fieldgate) Name() string { return ImplFieldgate }

func (f *Fieldgate) Subscribe(h uint32, filter string, qos byte) {
	if _, err := f.x.Subscribe(matcher.Handle(h), filter, matcher.Options(qos), 0); err != nil {
		panic(fmt.Sprintf("fieldgate: subscribe %q: %v", filter, err))
	}
}

func (f *Fieldgate) Native(topic string) string { return topic }

func (f *Fieldgate) Match(topic string, dst []uint32) []uint32 {
	f.x.Match(topic, matcher.NoHandle, &f.r)
	dst = dst[:0]
	for _, d := range f.r.Deliveries {
		dst = append(dst, uint32(d.Handle))
	}
	return sortDedup(dst)
}

func (f *Fieldgate) MatchCount(topic string) int {
	f.x.Match(topic, matcher.NoHandle, &f.r)
	return len(f.r.Deliveries)
}

// ---- mochi-mqtt ----

// Mochi adapts mochi-mqtt's TopicsIndex. Sessions are identified by client
// id strings ("c" + handle), computed in advance.
type Mochi struct {
	x   *mqtt.TopicsIndex
	ids []string
}

// NewMochi returns an empty mochi index; ids[h] is the client id of handle h
// (nil: made on the fly).
func NewMochi(ids []string) *Mochi { return &Mochi{x: mqtt.NewTopicsIndex(), ids: ids} }

func (m *Mochi) Name() string { return ImplMochi }

func (m *Mochi) clientID(h uint32) string {
	if int(h) < len(m.ids) {
		return m.ids[h]
	}
	return "c" + strconv.FormatUint(uint64(h), 10)
}

func (m *Mochi) Subscribe(h uint32, filter string, qos byte) {
	m.x.Subscribe(m.clientID(h), packets.Subscription{Filter: filter, Qos: qos})
}

func (m *Mochi) Native(topic string) string { return topic }

func (m *Mochi) Match(topic string, dst []uint32) []uint32 {
	dst = dst[:0]
	for id := range m.x.Subscribers(topic).Subscriptions {
		h, err := strconv.ParseUint(id[1:], 10, 32)
		if err != nil {
			panic("mochi: unexpected client id " + id)
		}
		dst = append(dst, uint32(h))
	}
	return sortDedup(dst)
}

func (m *Mochi) MatchCount(topic string) int {
	return len(m.x.Subscribers(topic).Subscriptions)
}

// ---- NATS ----

// NATS adapts the NATS server's generic sublist, with the session handle as
// value. Filters are translated to subjects (see NATSSubjects); a filter
// ending in "/#" is inserted twice, so a session can be reported more than
// once and Match deduplicates.
type NATS struct {
	sl     *gsl.GenericSublist[uint32]
	subj   map[string][]string
	topics map[string]string
	buf    []uint32
	cb     func(uint32)
}

// NewNATS returns an empty sublist. subj and topics hold pre-translated
// filters and topic names (either may be nil: translated on the fly).
func NewNATS(subj map[string][]string, topics map[string]string) *NATS {
	n := &NATS{sl: gsl.NewSublist[uint32](), subj: subj, topics: topics}
	n.cb = func(h uint32) { n.buf = append(n.buf, h) }
	return n
}

func (n *NATS) Name() string { return ImplNATS }

func (n *NATS) Subscribe(h uint32, filter string, qos byte) {
	subjects, ok := n.subj[filter]
	if !ok {
		subjects = NATSSubjects(filter)
	}
	for _, s := range subjects {
		if err := n.sl.Insert(s, h); err != nil {
			panic(fmt.Sprintf("nats: insert %q: %v", s, err))
		}
	}
}

func (n *NATS) Native(topic string) string {
	if t, ok := n.topics[topic]; ok {
		return t
	}
	return NATSTopic(topic)
}

func (n *NATS) Match(topic string, dst []uint32) []uint32 {
	n.buf = n.buf[:0]
	n.sl.Match(topic, n.cb)
	dst = append(dst[:0], n.buf...)
	return sortDedup(dst)
}

func (n *NATS) MatchCount(topic string) int {
	n.buf = n.buf[:0]
	n.sl.Match(topic, n.cb)
	return len(n.buf)
}

func sortDedup(s []uint32) []uint32 {
	slices.Sort(s)
	return slices.Compact(s)
}
