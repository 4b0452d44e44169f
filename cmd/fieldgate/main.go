// Command fieldgate is the edge gateway firmware: it runs the gateway,
// checks configuration files and reports how it was built.
//
//	fieldgate run [-config FILE]    run until SIGINT or SIGTERM
//	fieldgate check [-config FILE]  validate a configuration, listing every problem
//	fieldgate passwd [-D] FILE USER set (from stdin) or delete a user's password
//	fieldgate db check|stats        verify the state file, or print what it holds
//	fieldgate sensors scan [-bus N] probe an I²C bus and name what answers
//	fieldgate version               print version, commit, Go version and target
//
// Without -config, the configuration embedded in the binary is used.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/fieldgate/fieldgate/gateway/config"
)

// Stamped at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "dev"
)

// Exit codes: 1 for a failure the user can fix in the configuration or
// environment, 2 for a malformed command line.
const (
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stderr)
	case "check":
		return cmdCheck(args[1:], stdout, stderr)
	case "passwd":
		return cmdPasswd(args[1:], os.Stdin, stdout, stderr)
	case "db":
		return cmdDB(args[1:], stdout, stderr)
	case "sensors":
		return cmdSensors(args[1:], stdout, stderr)
	case "version":
		printVersion(stdout)
		return 0
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "fieldgate: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: fieldgate <command> [flags]

commands:
  run [-config FILE]    run the gateway until SIGINT or SIGTERM
  check [-config FILE]  validate a configuration and list every problem
  passwd [-D] FILE USER set USER's password in FILE from stdin, or delete USER
  db check|stats [-config FILE | -path STATE.db]
                        verify the state file, or print what it holds (gateway stopped)
  db deadletters [list|retry|drop] [-config FILE] [-bridge NAME] [-all | SEQ...]
                        list the messages a bridge's upstream kept refusing, or retry
                        or drop them (through the running gateway's ops endpoint)
  sensors scan [-bus N] list the devices answering on I²C bus N (default 1), or sim
  version               print version, commit, Go version and target
  help                  print this text

Without -config, the configuration embedded in the binary is used:
no hardware, simulated sensors, listeners on loopback only.
`)
}

func printVersion(w io.Writer) {
	fmt.Fprintf(w, "fieldgate %s (commit %s)\n", version, commit)
	target := runtime.GOOS + "/" + runtime.GOARCH
	// The ARM revision is not in package runtime; the build settings
	// recorded in the binary carry it.
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "GOARM" && s.Value != "" {
				target += " GOARM=" + s.Value
			}
		}
	}
	fmt.Fprintf(w, "%s %s\n", runtime.Version(), target)
}

// loadConfig parses a subcommand's flags, which are only -config, and
// loads that file or, without one, the embedded configuration. On failure it
// has already told the user why and returns the exit code.
func loadConfig(cmd string, args []string, stderr io.Writer) (cfg *config.Config, name string, code int) {
	fs := flag.NewFlagSet("fieldgate "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration `FILE` (default: the embedded configuration)")
	if err := fs.Parse(args); err != nil {
		return nil, "", exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fieldgate %s: unexpected argument %q; pass the file with -config\n", cmd, fs.Arg(0))
		return nil, "", exitUsage
	}

	var err error
	if *path == "" {
		name = config.EmbeddedName
		cfg, err = config.Parse(name, config.Embedded())
	} else {
		name = *path
		cfg, err = config.Load(name)
	}
	if err != nil {
		printProblems(stderr, err)
		return nil, "", exitFail
	}
	return cfg, name, 0
}

// printProblems writes one line per configuration problem.
func printProblems(w io.Writer, err error) {
	var cerr *config.Error
	if !errors.As(err, &cerr) {
		fmt.Fprintln(w, err)
		return
	}
	for _, p := range cerr.Problems {
		fmt.Fprintln(w, p)
	}
}

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	cfg, name, code := loadConfig("check", args, stderr)
	if code != 0 {
		return code
	}
	// Valid but dangerous: said on every check, and the file still passes,
	// since a trusted network may want it.
	for _, w := range cfg.Warnings() {
		fmt.Fprintf(stderr, "WARNING: %s\n", w)
	}
	fmt.Fprintf(stdout, "ok: %s\n", name)
	return 0
}
