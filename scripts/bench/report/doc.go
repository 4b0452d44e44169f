// Package report turns the raw output of the side-by-side benchmarks in
// scripts/bench/results into Markdown and SVG: each comparison's summary
// (results/NAME-summary.md, which its script writes through
// cmd/benchreport when it ends) and the whole report, docs/BENCHMARKS.md
// with its plots in docs/bench/*.svg, which bench-all.sh writes last. The
// report is made from the raw output too, never from the summaries, so a
// section of it and its summary are the same text.
//
// Raw files are Go benchmark output, read by golang.org/x/perf/benchfmt,
// with lines of our own around it ("key: value" headers, "# skip" and
// "# warn" comments, the footprint's records). Every figure shown is the
// median of its runs as golang.org/x/perf/benchmath computes it. Every
// target a comparison is judged against comes from package targets.
//
// The comparisons (Parts): matcher (bench-matcher.sh, one raw file per
// GOARCH), broker (bench-broker.sh), storage (bench-storage.sh), bridge
// (bench-bridge.sh), footprint (bench-footprint.sh) and idle
// (bench-idle.sh, fieldgate's cost at rest, judged against a limit of its
// own rather than a peer). The report adds
// plots of the matcher against the number of subscriptions and of the
// broker's memory scenarios against the number of subscriptions and
// connections, from the broker run and bench-all.sh's sweeps
// (results/sweep-*.txt).
package report
