// Command benchreport turns the results of the side-by-side benchmarks in
// scripts/bench/results into one report, docs/BENCHMARKS.md: how to
// reproduce it, the machine and the versions compared, a headline table of
// every target with its verdict, one section per comparison (the
// summaries the benchmark scripts wrote, embedded) and SVG plots of the
// broker's memory and throughput against the number of subscriptions and
// connections and of the matcher against the number of subscriptions.
// bench-all.sh runs it last.
//
// Usage, from scripts/bench:
//
//	benchreport [-quick] [-results results] [-o ../../docs/BENCHMARKS.md] [-svg ../../docs/bench]
//
// With -quick it reads the results of QUICK=1 runs (results/*-quick-*)
// and says at the top of the report, loudly, that they are no benchmark.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	r := &report{}
	fs.StringVar(&r.dir, "results", "results", "`directory` of the benchmarks' raw output and summaries")
	fs.StringVar(&r.out, "o", "../../docs/BENCHMARKS.md", "the report's `path`")
	fs.StringVar(&r.svgDir, "svg", "../../docs/bench", "`directory` for the SVG plots, linked from the report")
	fs.BoolVar(&r.quick, "quick", false, "report on the results of QUICK=1 runs (*-quick-*), marked as such")
	fs.StringVar(&r.arch, "arch", runtime.GOARCH, "GOARCH of the broker benchmarks' raw output files")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(stderr, "benchreport: no arguments expected, only flags")
		fs.Usage()
		return 2
	}
	written, err := r.write()
	if err != nil {
		fmt.Fprintln(stderr, "benchreport:", err)
		return 1
	}
	for _, w := range r.warnings {
		fmt.Fprintln(stderr, "benchreport: note:", w)
	}
	for _, name := range written {
		fmt.Fprintln(stdout, "wrote", name)
	}
	return 0
}
