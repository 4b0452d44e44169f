package main

import (
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/fieldgate/fieldgate/storage"
)

// cmdDB runs fieldgate db check|stats: the state file, read only, while
// the gateway is stopped; and fieldgate db deadletters (deadletters.go).
func cmdDB(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "deadletters" {
		return cmdDeadLetters(args[1:], stdout, stderr)
	}
	if len(args) == 0 || (args[0] != "check" && args[0] != "stats") {
		fmt.Fprintln(stderr, "usage: fieldgate db check|stats [-config FILE | -path STATE.db]\n"+deadLettersUsage)
		return exitUsage
	}
	sub := args[0]
	fs := flag.NewFlagSet("fieldgate db "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "configuration `FILE` naming storage.path (default: the embedded configuration)")
	path := fs.String("path", "", "the state `FILE` itself, instead of the one the configuration names")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fieldgate db %s: unexpected argument %q\n", sub, fs.Arg(0))
		return exitUsage
	}
	file := *path
	if file == "" {
		var cargs []string
		if *cfgPath != "" {
			cargs = []string{"-config", *cfgPath}
		}
		cfg, _, code := loadConfig("db "+sub, cargs, stderr)
		if cfg == nil {
			return code
		}
		file = cfg.Storage.Path
	}
	db, err := storage.OpenReadOnly(file)
	if err != nil {
		fmt.Fprintf(stderr, "fieldgate db %s: %v\n", sub, err)
		return exitFail
	}
	defer db.Close()
	if sub == "check" {
		problems := db.Check()
		for _, p := range problems {
			fmt.Fprintf(stdout, "%s: %s\n", file, p)
		}
		if len(problems) > 0 {
			fmt.Fprintf(stderr, "fieldgate db check: %d problems in %s\n", len(problems), file)
			return exitFail
		}
		fmt.Fprintf(stdout, "ok: %s\n", file)
		return 0
	}
	st, err := db.Stats()
	if err != nil {
		fmt.Fprintf(stderr, "fieldgate db stats: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: %d bytes, page size %d, %d free pages, schema %d, %d sessions\n",
		st.Path, st.Size, st.PageSize, st.FreePages, st.Schema, st.Sessions)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "bucket\tkeys\tkey bytes\tvalue bytes\tpages\t")
	for _, b := range st.Buckets {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t\n", b.Name, b.Keys, b.KeyBytes, b.ValueBytes, b.Pages)
	}
	if err := tw.Flush(); err != nil {
		return exitFail
	}
	if len(st.Outboxes) > 0 {
		fmt.Fprintln(stdout)
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "outbox\tentries\tbytes\tsequences\toldest\tundecodable\t")
		for _, o := range st.Outboxes {
			oldest := "-"
			if o.Count > 0 {
				oldest = time.Unix(0, o.Oldest).UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d-%d\t%s\t%d\t\n", o.Bridge, o.Count, o.Bytes, o.FirstSeq, o.LastSeq, oldest, o.Undecodable)
		}
		if err := tw.Flush(); err != nil {
			return exitFail
		}
	}
	if len(st.DeadLetters) == 0 {
		return 0
	}
	fmt.Fprintln(stdout)
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "dead letters\tcount\tbytes\tsequences\tundecodable\t")
	for _, d := range st.DeadLetters {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d-%d\t%d\t\n", d.Bridge, d.Count, d.Bytes, d.FirstSeq, d.LastSeq, d.Undecodable)
	}
	if err := tw.Flush(); err != nil {
		return exitFail
	}
	return 0
}
