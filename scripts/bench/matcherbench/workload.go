// Package matcherbench compares the fieldgate subscription index with the
// topic indexes of two other brokers (mochi-mqtt v2 and the NATS server's
// generic sublist) on the same generated workloads.
//
// The workload generator is deterministic: a given Params always produces the
// same filter strings, sessions and publish topics, on every architecture.
package matcherbench

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Prefix shapes.
const (
	// PrefixDistinct puts the device identifier in the first level
	// ("d000123/room4/sensor2/..."), so the root of the tree is very wide
	// and everything below it is narrow.
	PrefixDistinct = "distinct"
	// PrefixShared puts every filter under a common prefix
	// ("site/plant/line7/dev000123/temp"): the first levels are shared by
	// the whole fleet and the wide level comes late.
	PrefixShared = "shared"
)

// TopicCount is the number of publish topics of a workload (a power of two so
// the benchmark loop can cycle through them with a mask).
const TopicCount = 4096

// HotEvery: in a workload with fan-out, every HotEvery-th publish topic is
// the hot topic.
const HotEvery = 16

// Params describes one workload.
type Params struct {
	Subs   int    // subscriptions of the regular sessions
	Wild   int    // percentage of those subscriptions that use a wildcard (0..100)
	Prefix string // PrefixDistinct or PrefixShared
	Depth  int    // levels of an exact filter (>= 3)
	Fanout int    // extra sessions all subscribed to the hot filter (0 or 1 = none)
	Seed   uint64 // 0 = default seed
}

// Name is the workload part of a benchmark name, e.g.
// "subs=100000/wild=10/prefix=distinct/depth=5/fanout=1".
func (p Params) Name() string {
	f := p.Fanout
	if f < 1 {
		f = 1
	}
	return fmt.Sprintf("subs=%d/wild=%d/prefix=%s/depth=%d/fanout=%d", p.Subs, p.Wild, p.Prefix, p.Depth, f)
}

// HotSessions is the number of extra sessions subscribed to the hot filter.
func (p Params) HotSessions() int {
	if p.Fanout <= 1 {
		return 0
	}
	return p.Fanout
}

// Sub is one subscription of a workload.
type Sub struct {
	Handle uint32 // session handle, >= 1
	QoS    byte
	Filter string // MQTT topic filter; allocated once, shared by every implementation
}

// Workload is a generated set of subscriptions and publish topics.
type Workload struct {
	Params
	Sessions  int      // regular sessions: handles 1..Sessions
	Subs      []Sub    // regular subscriptions followed by the hot-filter subscriptions
	Topics    []string // TopicCount publish topic names
	HotFilter string   // "" without fan-out
	HotTopic  string

	// Pre-computed strings used by the peer adapters, created before any
	// index is built so that they are not counted in its memory.
	ClientIDs []string            // mochi client id per handle (index = handle)
	NATSSubj  map[string][]string // MQTT filter -> NATS subjects to insert
	NATSTopic map[string]string   // MQTT topic name -> NATS subject
}

// TotalSubs is the number of subscriptions including the hot-filter ones.
func (w *Workload) TotalSubs() int { return len(w.Subs) }

// MaxHandle is the largest session handle used.
func (w *Workload) MaxHandle() uint32 { return uint32(w.Sessions + w.HotSessions()) }

// wildcard shape kinds
const (
	shapePlus     = iota // one non-first level replaced by "+"
	shapeHash            // truncated after `keep` levels, then "#"
	shapePlusHash        // both ("devices/+/cmd/#")
)

type shape struct {
	kind int
	plus int // level replaced by "+"
	keep int // levels kept before "#"
}

func (s shape) String() string {
	switch s.kind {
	case shapePlus:
		return fmt.Sprintf("+@%d", s.plus)
	case shapeHash:
		return fmt.Sprintf("#@%d", s.keep)
	default:
		return fmt.Sprintf("+@%d#@%d", s.plus, s.keep)
	}
}

var metrics = [...]string{"temp", "hum", "pres", "co2", "volt", "amp", "state", "cmd"}

// level names below the device level (distinct) or between the common prefix
// and the device level (shared)
var levelNames = [...]string{"room", "sensor", "ch", "bus", "unit", "rack", "slot", "port", "reg", "grp", "zone", "cell"}

// mix is a small integer hash (splitmix64 finaliser).
func mix(a, b uint64) uint64 {
	z := a*0x9e3779b97f4a7c15 + b + 0x632be59bd9b4e5f5
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// gen holds the generator state for one workload.
type gen struct {
	p        Params
	rng      *rand.Rand
	devLevel int // level holding the device id
}

// devicePath returns the levels of the exact path of device d with the last
// level set to leaf.
func (g *gen) devicePath(d int, leaf string) []string {
	L := g.p.Depth
	lv := make([]string, L)
	lv[L-1] = leaf
	if g.p.Prefix == PrefixDistinct {
		lv[0] = fmt.Sprintf("d%06d", d)
		for j := 1; j < L-1; j++ {
			lv[j] = levelNames[(j-1)%len(levelNames)] + strconv.Itoa(int(mix(uint64(d), uint64(j))%8))
		}
		return lv
	}
	// shared: site/plant/line7/.../dev000123/leaf
	lv[0] = "site"
	lv[L-2] = fmt.Sprintf("dev%06d", d)
	for j := 1; j < L-2; j++ {
		switch j {
		case 1:
			lv[j] = "plant"
		case 2:
			lv[j] = "line" + strconv.Itoa(int(mix(uint64(d), 2)%16))
		default:
			lv[j] = levelNames[(j+8)%len(levelNames)] + strconv.Itoa(int(mix(uint64(d), uint64(j))%4))
		}
	}
	return lv
}

// candidateShapes lists the wildcard shapes allowed for the parameters.
// Wildcards never replace or cut above the device level (so a wildcard
// filter still belongs to one device and fan-out stays a separate knob), the
// first level is never a wildcard, and "+" is never directly followed by "#"
// (mochi-mqtt v2.7.9 does not match "a/+/#" against "a/b"; that case is
// checked by the conformance tests of the fieldgate matcher, not here).
func (g *gen) candidateShapes() (plus, hash, both []shape) {
	L, dl := g.p.Depth, g.devLevel
	for p := 1; p < L; p++ {
		if p != dl {
			plus = append(plus, shape{kind: shapePlus, plus: p})
		}
	}
	for k := dl + 1; k <= L; k++ {
		hash = append(hash, shape{kind: shapeHash, keep: k})
	}
	for p := 1; p < L; p++ {
		if p == dl {
			continue
		}
		for k := max(p+2, dl+1); k <= L; k++ {
			both = append(both, shape{kind: shapePlusHash, plus: p, keep: k})
		}
	}
	return
}

// pickShapes chooses the handful of wildcard shapes the fleet uses.
func (g *gen) pickShapes() []shape {
	plus, hash, both := g.candidateShapes()
	var out []shape
	pick := func(s []shape) {
		if len(s) > 0 {
			out = append(out, s[g.rng.IntN(len(s))])
		}
	}
	pick(plus)
	pick(hash)
	pick(both)
	all := append(append(append([]shape{}, plus...), hash...), both...)
	pick(all)
	return out
}

// applyShape turns an exact path into a wildcard filter.
func applyShape(lv []string, s shape) []string {
	out := append([]string(nil), lv...)
	if s.kind == shapePlus || s.kind == shapePlusHash {
		out[s.plus] = "+"
	}
	if s.kind == shapeHash || s.kind == shapePlusHash {
		out = append(out[:s.keep], "#")
	}
	return out
}

// subSpec remembers how a subscription was made, to instantiate topics.
type subSpec struct {
	device int
	metric int
	shape  int // -1 = exact
}

// Generate builds the workload for p.
func Generate(p Params) *Workload {
	if p.Depth < 3 {
		panic("matcherbench: depth must be >= 3")
	}
	if p.Prefix != PrefixDistinct && p.Prefix != PrefixShared {
		panic("matcherbench: unknown prefix shape " + p.Prefix)
	}
	seed := p.Seed
	if seed == 0 {
		seed = 0x5eed
	}
	seed ^= uint64(p.Subs)*1000003 ^ uint64(p.Wild)*7919 ^ uint64(p.Depth)*104729 ^ uint64(p.HotSessions())*15485863
	if p.Prefix == PrefixShared {
		seed ^= 0xabcdef
	}
	g := &gen{p: p, rng: rand.New(rand.NewPCG(seed, 0x6a09e667f3bcc908))}
	if p.Prefix == PrefixShared {
		g.devLevel = p.Depth - 2
	}
	shapes := g.pickShapes()

	n := p.Subs
	devices := max(1, n/4)
	sessions := max(1, n/8)
	hot := p.HotSessions()
	w := &Workload{Params: p, Sessions: sessions, Subs: make([]Sub, 0, n+hot)}
	specs := make([]subSpec, 0, n)

	var sb strings.Builder
	join := func(lv []string) string {
		sb.Reset()
		for i, l := range lv {
			if i > 0 {
				sb.WriteByte('/')
			}
			sb.WriteString(l)
		}
		return strings.Clone(sb.String())
	}

	for range n {
		sp := subSpec{device: g.rng.IntN(devices), metric: g.rng.IntN(len(metrics)), shape: -1}
		if p.Wild > 0 && g.rng.IntN(100) < p.Wild {
			sp.shape = g.rng.IntN(len(shapes))
		}
		lv := g.devicePath(sp.device, metrics[sp.metric])
		if sp.shape >= 0 {
			lv = applyShape(lv, shapes[sp.shape])
		}
		w.Subs = append(w.Subs, Sub{
			Handle: uint32(1 + g.rng.IntN(sessions)),
			QoS:    byte(g.rng.IntN(3)),
			Filter: join(lv),
		})
		specs = append(specs, sp)
	}
	if hot > 0 {
		w.HotFilter = join(g.devicePath(0, "alarm"))
		w.HotTopic = w.HotFilter
		for i := range hot {
			// Each hot session gets its own copy of the filter string, as a
			// broker decoding separate SUBSCRIBE packets would.
			w.Subs = append(w.Subs, Sub{
				Handle: uint32(sessions + 1 + i),
				QoS:    byte(i % 3),
				Filter: strings.Clone(w.HotFilter),
			})
		}
	}

	// Publish topics.
	w.Topics = make([]string, TopicCount)
	for i := range w.Topics {
		if hot > 0 && i%HotEvery == 0 {
			w.Topics[i] = w.HotTopic
			continue
		}
		if n == 0 || g.rng.IntN(10) == 0 {
			// Unmatched: an unknown device, or one level too deep.
			if g.rng.IntN(2) == 0 || n == 0 {
				w.Topics[i] = join(g.devicePath(devices+g.rng.IntN(devices), metrics[g.rng.IntN(len(metrics))]))
			} else {
				sp := specs[g.rng.IntN(n)]
				w.Topics[i] = join(append(g.devicePath(sp.device, metrics[sp.metric]), "raw"))
			}
			continue
		}
		sp := specs[g.rng.IntN(n)]
		lv := g.devicePath(sp.device, metrics[sp.metric])
		if sp.shape >= 0 {
			s := shapes[sp.shape]
			if (s.kind == shapePlus || s.kind == shapePlusHash) && g.rng.IntN(2) == 0 {
				lv[s.plus] = "x" + strconv.Itoa(g.rng.IntN(1000))
			}
			if s.kind == shapeHash || s.kind == shapePlusHash {
				switch g.rng.IntN(3) {
				case 0: // the parent level of "#"
					lv = lv[:s.keep]
				case 1: // the full path
				case 2: // deeper than any exact filter
					lv = append(lv, "ext"+strconv.Itoa(g.rng.IntN(4)))
				}
			}
		}
		w.Topics[i] = join(lv)
	}

	// Strings for the peers.
	w.ClientIDs = make([]string, int(w.MaxHandle())+1)
	for h := 1; h < len(w.ClientIDs); h++ {
		w.ClientIDs[h] = "c" + strconv.Itoa(h)
	}
	w.NATSSubj = make(map[string][]string, len(w.Subs))
	for _, s := range w.Subs {
		if _, ok := w.NATSSubj[s.Filter]; !ok {
			w.NATSSubj[s.Filter] = NATSSubjects(s.Filter)
		}
	}
	w.NATSTopic = make(map[string]string, len(w.Topics))
	for _, t := range w.Topics {
		w.NATSTopic[t] = NATSTopic(t)
	}
	return w
}

// NATSTopic translates an MQTT topic name into a NATS subject.
func NATSTopic(topic string) string {
	return strings.ReplaceAll(topic, "/", ".")
}

// NATSSubjects translates an MQTT filter into the NATS subjects that together
// match the same topics: "/"->".", "+"->"*", "#"->">", and because ">" does not
// match its parent, "x/#" also needs "x" ("a/+/#" -> "a.*.>" and "a.*").
// Empty levels and "$" topics are not translated faithfully (the workload has
// none).
func NATSSubjects(filter string) []string {
	lv := strings.Split(filter, "/")
	for i, l := range lv {
		switch l {
		case "+":
			lv[i] = "*"
		case "#":
			lv[i] = ">"
		}
	}
	out := []string{strings.Join(lv, ".")}
	if len(lv) > 1 && lv[len(lv)-1] == ">" {
		out = append(out, strings.Join(lv[:len(lv)-1], "."))
	}
	return out
}

// MatchFilter is a straightforward reference implementation of MQTT topic
// matching (no "$" rule, no shared subscriptions), used only to explain a
// disagreement between the implementations.
func MatchFilter(filter, topic string) bool {
	fl := strings.Split(filter, "/")
	tl := strings.Split(topic, "/")
	for i, f := range fl {
		if f == "#" {
			return true
		}
		if i >= len(tl) {
			return false
		}
		if f != "+" && f != tl[i] {
			return false
		}
	}
	return len(fl) == len(tl)
}
