package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/fieldgate/fieldgate/sensors"
)

const sensorsUsage = "usage: fieldgate sensors scan [-bus N]"

// cmdSensors runs fieldgate sensors scan: which I²C addresses answer, and
// what is likely there.
func cmdSensors(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "scan" {
		fmt.Fprintln(stderr, sensorsUsage)
		return exitUsage
	}
	fs := flag.NewFlagSet("fieldgate sensors scan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bus := fs.String("bus", "1", "the I²C bus: its number `N` (1 is /dev/i2c-1), or sim for the simulated hardware")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fieldgate sensors scan: unexpected argument %q; name the bus with -bus\n", fs.Arg(0))
		return exitUsage
	}
	var buses sensors.Buses
	defer buses.Close()
	b, err := buses.I2C(*bus)
	if err != nil {
		fmt.Fprintf(stderr, "fieldgate sensors scan: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "I²C bus %s:\n", b)
	if err := sensors.WriteGrid(stdout, sensors.Scan(b)); err != nil {
		fmt.Fprintf(stderr, "fieldgate sensors scan: %v\n", err)
		return exitFail
	}
	return 0
}
