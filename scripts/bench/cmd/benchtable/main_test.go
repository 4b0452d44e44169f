package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
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

func TestParseAndRender(t *testing.T) {
	r, err := parse("raw.txt", strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if r.goarch != "amd64" || r.cpu != "Test CPU" || len(r.rows) != 2 {
		t.Fatalf("parsed %q %q %v", r.goarch, r.cpu, r.rows)
	}
	if got := r.vals[r.rows[0]][ours].ns; len(got) != 3 {
		t.Fatalf("ns values %v", got)
	}
	var sb strings.Builder
	render(&sb, []*run{r}, "go1.x", "peer v1")
	s := sb.String()
	for _, want := range []string{
		"| 1M w10% distinct d5 f1 | 1.50 | 120 | 3000 | 200 | 25.0× | **1.67× ✗** | 0 / 6 / 0 |", // median 120; nats only 1.67×
		"| 50 | 1500 | 400 | 30.0× | 8.00× |",                                                    // memory at 1M: both ratios meet the targets
		"| 1k w0% shared d5 f10k |",
		"✗ allocs", // 1 alloc/op in the second row
		"Rows missing targets (2)",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "memory vs nats") {
		t.Errorf("8× memory vs nats should meet the 6× target:\n%s", s)
	}
}
