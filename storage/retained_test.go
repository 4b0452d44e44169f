package storage

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/matcher"
)

func TestRetained(t *testing.T) {
	db := openTemp(t, Options{})
	msgs := []Message{
		{Topic: "a/b", Payload: []byte("1"), QoS: 1, Retain: true},
		{Topic: "a/b/c", Payload: []byte("2"), Props: []byte{1, 1}, Retain: true, Expiry: 99},
		{Topic: "$SYS/x", Payload: []byte("3"), Retain: true},
	}
	commit(t, db, func(b *Batch) {
		for i := range msgs {
			b.SetRetained(&msgs[i])
		}
	})
	for i := range msgs {
		got, err := db.Retained(msgs[i].Topic)
		if err != nil {
			t.Fatal(err)
		}
		if d := sameMessage(got, &msgs[i]); d != "" {
			t.Errorf("%s: %s", msgs[i].Topic, d)
		}
	}
	if m, err := db.Retained("a"); m != nil || err != nil {
		t.Errorf("unknown topic: %+v, %v", m, err)
	}
	if n := db.RetainedCount(); n != 3 {
		t.Errorf("count %d, want 3", n)
	}

	// Replacing and deleting.
	commit(t, db, func(b *Batch) {
		b.SetRetained(&Message{Topic: "a/b", Payload: []byte("new")})
		b.DeleteRetained("a/b/c")
		b.DeleteRetained("never/there")
	})
	if m, _ := db.Retained("a/b"); m == nil || string(m.Payload) != "new" {
		t.Errorf("replaced: %+v", m)
	}
	if m, _ := db.Retained("a/b/c"); m != nil {
		t.Errorf("deleted: %+v", m)
	}
	if n := db.RetainedCount(); n != 2 {
		t.Errorf("count %d, want 2", n)
	}
}

// matchTopics returns the topics MatchRetained finds for filter.
func matchTopics(t testing.TB, db *DB, filter string) []string {
	t.Helper()
	var got []string
	err := db.MatchRetained(filter, matcher.Matches, func(m *Message) { got = append(got, m.Topic) })
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// randomTopic draws topics from a small alphabet of levels, so that random
// filters match a fair share of them; empty levels and $-topics included.
func randomTopic(r *rand.Rand) string {
	levels := []string{"a", "b", "c", "ab", "", "sensor", "temp", "ä"}
	n := 1 + r.IntN(5)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = levels[r.IntN(len(levels))]
	}
	switch r.IntN(10) {
	case 0:
		parts[0] = "$SYS"
	case 1:
		parts[0] = "$share-not"
	}
	t := strings.Join(parts, "/")
	if t == "" {
		return "a"
	}
	return t
}

// randomFilter turns a random topic into a filter by replacing levels
// with '+' and cutting it at a '#'.
func randomFilter(r *rand.Rand) string {
	parts := strings.Split(randomTopic(r), "/")
	for i := range parts {
		if r.IntN(4) == 0 {
			parts[i] = "+"
		}
	}
	if r.IntN(3) == 0 {
		parts = append(parts[:r.IntN(len(parts)+1)], "#")
	}
	return strings.Join(parts, "/")
}

func TestMatchRetainedOracle(t *testing.T) {
	db := openTemp(t, Options{})
	r := rand.New(rand.NewPCG(7, 11))
	topics := map[string]bool{}
	for len(topics) < 3000 {
		topics[randomTopic(r)] = true
	}
	var all []string
	var b Batch
	for topic := range topics {
		all = append(all, topic)
		b.SetRetained(&Message{Topic: topic, Payload: []byte(topic)})
	}
	slices.Sort(all)
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	filters := []string{
		"#", "+", "+/#", "+/+", "/#", "+/", "a", "a/#", "a/+", "a/+/#", "a/b/#", "+/b/#",
		"$SYS/#", "$SYS/+", "$SYS", "+/+/+/+/+", "ä/#", "sensor/+/temp", "a//#", "//#",
		"nothing/#", "ab/#", "a/b", "$share-not/#",
	}
	for range 600 {
		filters = append(filters, randomFilter(r))
	}
	total := 0
	for _, f := range filters {
		if err := matcher.ValidateFilter(f); err != nil {
			t.Fatalf("test made an invalid filter %q: %v", f, err)
		}
		var want []string
		for _, topic := range all {
			if matcher.Matches(f, topic) {
				want = append(want, topic)
			}
		}
		got := matchTopics(t, db, f)
		if !slices.Equal(got, want) {
			t.Errorf("filter %q: got %d topics, want %d\n got  %q\n want %q", f, len(got), len(want), got, want)
		}
		total += len(want)
	}
	t.Logf("%d filters over %d topics, %d matches", len(filters), len(all), total)
}

// TestMatchRetainedParent: "a/b/#" also matches "a/b" [MQTT-4.7.1-1],
// which sorts before the prefix "a/b/" a cursor seeks to.
func TestMatchRetainedParent(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for _, topic := range []string{"a", "a/b", "a/b/c", "a/bc", "$SYS"} {
			b.SetRetained(&Message{Topic: topic})
		}
	})
	for _, tc := range []struct {
		filter string
		want   []string
	}{
		{"a/b/#", []string{"a/b", "a/b/c"}},
		{"a/#", []string{"a", "a/b", "a/b/c", "a/bc"}},
		{"#", []string{"a", "a/b", "a/b/c", "a/bc"}},
		{"$SYS/#", []string{"$SYS"}},
		{"a/+/#", []string{"a/b", "a/b/c", "a/bc"}},
	} {
		if got := matchTopics(t, db, tc.filter); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.filter, got, tc.want)
		}
	}
}

// TestMatchRetainedReadsPrefix: a wildcard filter reads only the topics
// under its literal prefix, counted by the calls of the matches function.
func TestMatchRetainedReadsPrefix(t *testing.T) {
	db := openTemp(t, Options{})
	commit(t, db, func(b *Batch) {
		for i := range 1000 {
			b.SetRetained(&Message{Topic: fmt.Sprintf("z/%d/x", i)})
			b.SetRetained(&Message{Topic: fmt.Sprintf("a/a/%d", i)})
		}
		for i := range 10 {
			b.SetRetained(&Message{Topic: fmt.Sprintf("a/b/%d", i)})
		}
		b.SetRetained(&Message{Topic: "a/b"})
		b.SetRetained(&Message{Topic: "a/bc/1"})
	})
	for _, tc := range []struct {
		filter          string
		found, maxCalls int
	}{
		{"a/b/#", 11, 11},
		{"a/b/+", 10, 10},
		{"a/b/3", 1, 0},
		{"a/b/nothing", 0, 0},
		{"q/#", 0, 0},
	} {
		calls := 0
		count := func(f, topic string) bool { calls++; return matcher.Matches(f, topic) }
		found := 0
		if err := db.MatchRetained(tc.filter, count, func(*Message) { found++ }); err != nil {
			t.Fatal(err)
		}
		if found != tc.found || calls > tc.maxCalls {
			t.Errorf("%s: %d found with %d calls of matches, want %d with at most %d", tc.filter, found, calls, tc.found, tc.maxCalls)
		}
	}
}

// TestRetainedPageOracle: paging through a filter's retained messages
// with small pages finds what MatchRetained finds, in the same order,
// each once, and no page is larger than asked.
func TestRetainedPageOracle(t *testing.T) {
	db := openTemp(t, Options{})
	r := rand.New(rand.NewPCG(3, 5))
	var b Batch
	for range 3000 {
		topic := randomTopic(r)
		b.SetRetained(&Message{Topic: topic, Payload: make([]byte, r.IntN(300))})
	}
	if err := db.CommitWait(&b); err != nil {
		t.Fatal(err)
	}
	filters := []string{"#", "+", "+/#", "a/#", "a/b/#", "a/b", "a/+", "$SYS/#", "nothing/#", "nothing"}
	for range 200 {
		filters = append(filters, randomFilter(r))
	}
	for _, f := range filters {
		want := matchTopics(t, db, f)
		var got []string
		after := ""
		for pages := 0; ; pages++ {
			if pages > 10000 {
				t.Fatalf("%s: paging does not end", f)
			}
			maxN, maxBytes := 1+r.IntN(7), r.IntN(1000)
			page, last, done, err := db.RetainedPage(f, after, matcher.Matches, maxN, maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > maxN {
				t.Fatalf("%s: a page of %d messages, asked for at most %d", f, len(page), maxN)
			}
			size := 0
			for i := range page {
				size += messageRecordSize(&page[i])
				got = append(got, page[i].Topic)
			}
			if len(page) > 1 && size > maxBytes {
				t.Fatalf("%s: a page of %d messages holding %d bytes, asked for at most %d", f, len(page), size, maxBytes)
			}
			if done {
				break
			}
			if last == after && len(page) == 0 {
				t.Fatalf("%s: a page that neither ends nor moves on from %q", f, after)
			}
			after = last
		}
		if !slices.Equal(got, want) {
			t.Errorf("filter %q: paged %d topics, want %d\n got  %q\n want %q", f, len(got), len(want), got, want)
		}
	}
}
