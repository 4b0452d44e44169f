package bridge

import (
	"fmt"
	"time"

	"github.com/fieldgate/fieldgate/gateway/bridge/mqttclient"
)

// A message the upstream will not take can end every link it goes out
// on: NATS closes the link on a topic with a space in it, a 3.1.1 server
// closes it on a PUBLISH larger than it takes, or on a QoS it refuses.
// Resent first on every new link, such a message would hold up every
// message behind it for as long as it is queued. The bridge finds it and
// moves it to the dead letters (deadletter.go), and the uplink goes on.
//
// When the server ends a link (a DISCONNECT about a message, or the
// connection closed or reset: see serverRefused), the suspect is the
// lowest outbox entry that link sent and the server did not acknowledge.
// Links our side closes (a reload, a stop) and links found half-open put
// nothing under suspicion: a silent network says nothing of a message.
//
// One failure does not make the suspect guilty: with a window of messages
// in flight the server may have ended the link on a later one, whose
// acknowledgements for those before it were lost with the link. So the
// next link probes: it sends the suspect alone, after a PINGRESP has shown
// that the server keeps the link at all, and opens the window only once
// the suspect is acknowledged. A message before it that was never sent
// goes one at a time too, and a resumed session's other flights wait,
// their identifiers claimed. A healthy message behind a bad one is thus
// never blamed, and a server that drops every link, message or not, ends
// the probe's link before the PINGRESP, which blames nothing.
//
// The same suspect on consecutive links counts up; its acknowledgement,
// or its leaving the outbox, ends the suspicion. At dead_letter_after
// links in a row, the last of them a probe, it is moved to the dead
// letters with the server's reason. A QoS 2 suspect may first teach the
// bridge that the server takes no QoS 2 (learned.go): it is then probed
// again at QoS 1, and counts on from one.

// linkRun is what the run goroutine knows of one link while it lasts.
type linkRun struct {
	c     *mqttclient.Client
	id    uint64    // loop.link while it lasts
	start time.Time // when it came up
	acks  uint64    // progress when it came up
	// productive: it delivered something (see health.go); announced:
	// its connection was logged.
	productive, announced bool
	// probe is the suspect the link sends alone, and waits for, before
	// anything else; 0 once it is through, or when there is none.
	probe uint64
	// held are the flights of a resumed session that wait behind the
	// probe, their identifiers claimed.
	held map[uint64]*outFlight
}

// newLink starts the run of a link just connected.
func (b *Bridge) newLink(c *mqttclient.Client) *linkRun {
	b.loop.link++
	return &linkRun{c: c, id: b.loop.link, start: time.Now(), acks: b.progress.Load()}
}

// probeTarget returns the suspect a new link must probe, or 0. A suspect
// no longer in flight (acknowledged after all, expired, moved) is
// forgotten.
func (b *Bridge) probeTarget() uint64 {
	if b.loop.strikes == 0 {
		return 0
	}
	if !b.flights.has(b.loop.suspect) {
		b.loop.suspect, b.loop.strikes = 0, 0
		return 0
	}
	return b.loop.suspect
}

// probeThrough reports whether lk's probe is done with: acknowledged, or
// gone from the outbox. The suspicion ends with it.
func (b *Bridge) probeThrough(lk *linkRun) bool {
	if lk.probe == 0 {
		return true
	}
	if !b.ob.passed(lk.probe) {
		return false
	}
	lk.probe = 0
	b.loop.suspect, b.loop.strikes = 0, 0
	return true
}

// blame looks at a link that ended with err, the server's doing: the
// lowest entry it sent and the server did not acknowledge is the
// suspect, counted, and at dead_letter_after links in a row (a probe the
// last of them) moved to the dead letters.
func (b *Bridge) blame(lk *linkRun, err error) {
	if !serverRefused(err) {
		return
	}
	seq, ok := b.flights.lowestSentOn(lk.id)
	if !ok {
		return // it ended on nothing of ours: before the probe went, say
	}
	if seq != b.loop.suspect {
		b.loop.suspect, b.loop.strikes = seq, 0
	}
	b.loop.strikes++
	probed := lk.probe == seq
	if !probed {
		b.log.Debug("upstream ended the link; the next one probes the lowest message it did not acknowledge", "seq", seq, "err", err)
		return
	}
	e := b.ob.entry(seq)
	if e == nil {
		return // gone from the outbox meanwhile: nothing to move
	}
	if b.learnQoS2Refused(lk.c.Info().Version, e, err) {
		b.loop.strikes = 1 // probed again at QoS 1, and counted from there
		return
	}
	n := b.rt.Load().cfg.DeadLetterAfter
	if n == 0 || b.loop.strikes < n {
		b.log.Debug("upstream ended the link on a message sent alone", "topic", e.Msg.Topic, "failures", b.loop.strikes, "err", err)
		return
	}
	reason := fmt.Sprintf("the upstream ended %d links in a row on it (%s): %v", b.loop.strikes, failureKind(err), err)
	if derr := b.deadLetterAfter(*e, reason, b.loop.strikes); derr != nil {
		b.log.Warn("moving a message the upstream keeps refusing to the dead letters failed; it is tried again", "topic", e.Msg.Topic, "err", derr)
		return
	}
	b.loop.suspect, b.loop.strikes = 0, 0
}
