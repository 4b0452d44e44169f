// Command benchreport writes every Markdown file and plot of the
// side-by-side benchmarks from their raw output (see package report): the
// summary of one comparison, which each benchmark script writes when it
// ends, and the whole report, docs/BENCHMARKS.md, which bench-all.sh
// writes last.
//
// Usage, from scripts/bench:
//
//	benchreport summary [-o FILE] PART RAW...
//	benchreport report [-quick] [-results results] [-arch GOARCH] [-o ../../docs/BENCHMARKS.md] [-svg ../../docs/bench]
//
// summary prints the summary of PART (matcher, broker, storage, bridge,
// footprint or idle) made from the raw files RAW, and writes it to FILE too with
// -o. report reads every comparison's raw output in the results directory;
// with -quick it reads the results of QUICK=1 runs (results/*-quick-*) and
// says at the top of the report, loudly, that they are no benchmark.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/fieldgate/fieldgate/scripts/bench/report"
)

// Exit codes.
const (
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "summary":
			return cmdSummary(args[1:], stdout, stderr)
		case "report":
			return cmdReport(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: benchreport summary [-o FILE] PART RAW...")
	fmt.Fprintln(stderr, "       benchreport report [-quick] [-results DIR] [-arch GOARCH] [-o FILE] [-svg DIR]")
	return exitUsage
}

func cmdSummary(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchreport summary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "also write the summary to this `file`")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() < 2 || !slices.Contains(report.Parts, fs.Arg(0)) {
		fmt.Fprintf(stderr, "usage: benchreport summary [-o FILE] PART RAW...; PART is one of %s\n", strings.Join(report.Parts, ", "))
		return exitUsage
	}
	var md bytes.Buffer
	if err := report.WriteSummary(&md, fs.Arg(0), fs.Args()[1:]); err != nil {
		fmt.Fprintln(stderr, "benchreport summary:", err)
		return exitFail
	}
	if *out != "" {
		if err := os.WriteFile(*out, md.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, "benchreport summary:", err)
			return exitFail
		}
	}
	_, _ = stdout.Write(md.Bytes())
	return 0
}

func cmdReport(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchreport report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	r := &report.Report{}
	fs.StringVar(&r.Results, "results", "results", "`directory` of the benchmarks' raw output")
	fs.StringVar(&r.Out, "o", "../../docs/BENCHMARKS.md", "the report's `path`")
	fs.StringVar(&r.SVGDir, "svg", "../../docs/bench", "`directory` for the SVG plots, linked from the report")
	fs.BoolVar(&r.Quick, "quick", false, "report on the results of QUICK=1 runs (*-quick-*), marked as such")
	fs.StringVar(&r.Arch, "arch", runtime.GOARCH, "GOARCH of the broker benchmarks' raw output files")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(stderr, "benchreport report: no arguments expected, only flags")
		fs.Usage()
		return exitUsage
	}
	written, err := r.Write()
	if err != nil {
		fmt.Fprintln(stderr, "benchreport report:", err)
		return exitFail
	}
	for _, w := range r.Warnings {
		fmt.Fprintln(stderr, "benchreport report: note:", w)
	}
	for _, name := range written {
		fmt.Fprintln(stdout, "wrote", name)
	}
	return 0
}
