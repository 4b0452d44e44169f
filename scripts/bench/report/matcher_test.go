package report

import (
	"fmt"
	"strings"
	"testing"
)

// matcherRaw is the output of one benchmark binary: a row whose nats ratio
// misses its target, and one with an allocation per lookup.
const matcherRaw = `goos: linux
goarch: amd64
pkg: github.com/fieldgate/fieldgate/scripts/bench/matcherbench
cpu: Test CPU
BenchmarkMatch/impl=fieldgate/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2 	 1000000	       100.0 ns/op	        50.00 bytes/sub	         1.5 hits/op	       0 B/op	       0 allocs/op
BenchmarkMatch/impl=fieldgate/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2 	 1000000	       300.0 ns/op	        50.00 bytes/sub	         1.5 hits/op	       0 B/op	       0 allocs/op
BenchmarkMatch/impl=fieldgate/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2 	 1000000	       120.0 ns/op	        50.00 bytes/sub	         1.5 hits/op	       0 B/op	       0 allocs/op
BenchmarkMatch/impl=mochi/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2     	  100000	      3000 ns/op	      1500 bytes/sub	         1.5 hits/op	    1000 B/op	       6 allocs/op
BenchmarkMatch/impl=nats/subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1-2      	 1000000	       200.0 ns/op	       400.0 bytes/sub	         1.5 hits/op	       0 B/op	       0 allocs/op
BenchmarkMatch/impl=fieldgate/subs=1000/wild=0/prefix=shared/depth=5/fanout=10000     	 1000000	       10 ns/op	        50.00 bytes/sub	         1.5 hits/op	       0 B/op	       1 allocs/op
BenchmarkMatch/impl=mochi/subs=1000/wild=0/prefix=shared/depth=5/fanout=10000         	  100000	      1000 ns/op	      1500 bytes/sub	         1.5 hits/op	    1000 B/op	       6 allocs/op
BenchmarkMatch/impl=nats/subs=1000/wild=0/prefix=shared/depth=5/fanout=10000          	 1000000	       25 ns/op	       100.0 bytes/sub	         1.5 hits/op	       0 B/op	       0 allocs/op
PASS
`

func TestMatcherSummary(t *testing.T) {
	f, err := parseRaw("raw.txt", []byte(matcherRaw))
	if err != nil {
		t.Fatal(err)
	}
	r := newMatcherRun(f)
	if r.goarch != "amd64" || r.cpu != "Test CPU" || len(r.rows) != 2 {
		t.Fatalf("parsed %q %q %v", r.goarch, r.cpu, r.rows)
	}
	if r.reps != 3 {
		t.Fatalf("%d runs of fieldgate's rows, want 3", r.reps)
	}
	s := newMatcherSummary([]*rawFile{f}, meta{"go": {"go1.x"}, "mochi": {"peer v1"}})
	md := render(s)
	for _, want := range []string{
		"| 1M w10% distinct d5 f1 | 1.50 | 120 | 3000 | 200 | 25.0× | **1.67× ✗** | 0 / 6 / 0 |", // median 120; nats only 1.67×
		"| 50 | 1500 | 400 | 30.0× | 8.00× |",                                                    // memory at 1M: both ratios meet the targets
		"| 1k w0% shared d5 f10k |",
		"✗ allocs", // 1 alloc/op in the second row
		"Rows missing targets (2)",
		"- Go: go1.x\n- GOARCH: amd64\n- Peers: peer v1\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("summary lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "memory vs nats") {
		t.Errorf("8× memory vs nats should meet the 6× target:\n%s", md)
	}
}

// matcherRows writes raw output for rows of fieldgate, mochi and nats:
// each row is a workload, ns/op, bytes/sub and allocs/op of the three in
// that order.
func matcherRows(goarch string, rows ...[10]string) string {
	var b strings.Builder
	b.WriteString("goarch: " + goarch + "\n")
	for _, r := range rows {
		for i, impl := range []string{"fieldgate", "mochi", "nats"} {
			fmt.Fprintf(&b, "BenchmarkMatch/impl=%s/%s-2 1 %s ns/op %s bytes/sub %s allocs/op\n", impl, r[0], r[1+i], r[4+i], r[7+i])
		}
	}
	return b.String()
}

// The headline sums up each target over the rows of every GOARCH: the
// lowest ratio (or the most allocations) and how many rows missed.
func TestMatcherHeadline(t *testing.T) {
	const (
		k1      = "subs=1000/wild=10/prefix=distinct/depth=5/fanout=1"
		m1      = "subs=1000000/wild=10/prefix=distinct/depth=5/fanout=1"
		m1Share = "subs=1000000/wild=0/prefix=shared/depth=5/fanout=1"
	)
	amd64, err := parseRaw("results/matcher-amd64.txt", []byte(matcherRows("amd64",
		[10]string{k1, "100", "1230", "173", "100", "550", "390", "0", "7", "0"},
		[10]string{m1, "100", "434", "263", "100", "3870", "1670", "0", "7", "0"},
		[10]string{m1Share, "100", "1790", "879", "100", "2520", "901", "0", "6", "0"},
	)))
	if err != nil {
		t.Fatal(err)
	}
	i386, err := parseRaw("results/matcher-386.txt", []byte(matcherRows("386",
		[10]string{m1Share, "100", "1770", "638", "100", "2080", "582", "2", "6", "0"},
	)))
	if err != nil {
		t.Fatal(err)
	}
	got := newMatcherSummary([]*rawFile{amd64, i386}, nil).targets()
	want := []struct {
		text    string
		result  string
		verdict outcome
	}{
		{"lookup (ns/op) ≥ 10× faster than mochi's TopicsIndex, every workload",
			"amd64: lowest 4.34× (1M w10% distinct d5 f1), **1 of 3 workloads missed**; 386: lowest 17.7× (1M w0% shared d5 f1), none missed", missed},
		{"lookup (ns/op) ≥ 2× faster than the NATS sublist, every workload",
			"amd64: lowest 1.73× (1k w10% distinct d5 f1), **1 of 3 workloads missed**; 386: lowest 6.38× (1M w0% shared d5 f1), none missed", missed},
		// Memory is judged at 1M only: the 1k row's 5.5× does not count.
		{"bytes/sub ≤ 1/15 of mochi's at 1M subscriptions",
			"amd64: lowest 25.2× (1M w0% shared d5 f1), none missed; 386: lowest 20.8× (1M w0% shared d5 f1), none missed", met},
		{"bytes/sub ≤ 1/6 of the NATS sublist's at 1M subscriptions",
			"amd64: lowest 9.01× (1M w0% shared d5 f1), none missed; 386: lowest 5.82× (1M w0% shared d5 f1), **1 of 1 workloads missed**", missed},
		{"0 allocations per lookup",
			"amd64: 0 in all 3 workloads; 386: up to 2 (1M w0% shared d5 f1), **1 of 1 workloads missed**", missed},
	}
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].target != w.text || got[i].measured != w.result || got[i].outcome != w.verdict {
			t.Errorf("target %d:\n got %q / %q / %v\nwant %q / %q / %v", i, got[i].target, got[i].measured, got[i].outcome, w.text, w.result, w.verdict)
		}
	}
}
