package sensors

// The I²C bus scan behind `fieldgate sensors scan`: which addresses
// answer, and what is likely there. It reads and never writes, except
// for one status command to an address an SHT3x may hold, sent only
// when that address refused the read.

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"

	"periph.io/x/conn/v3/i2c"
)

// The addresses scanned, as i2cdetect does by default: 0x00–0x02 and
// 0x78–0x7f are reserved for general call, other bus protocols and
// 10-bit addressing, and no device answers there.
const (
	scanFirst uint16 = 0x03
	scanLast  uint16 = 0x77
)

// scanBoschAddrs are where the Bosch environmental sensors answer; their
// chip id register tells them apart.
var scanBoschAddrs = []uint16{0x76, 0x77}

// scanBoschChips names the Bosch chip ids read from register 0xD0.
var scanBoschChips = map[byte]string{
	bmp180ID: "BMP180",
	bmp280ID: "BMP280",
	bme280ID: "BME280",
	0x61:     "BME680",
}

// scanSHT3xAddrs are where an SHT3x can be strapped. An SHT3x with no
// measurement to give refuses a read header, so the read probe misses
// it; there it is asked for its status register instead.
var scanSHT3xAddrs = []uint16{0x44, 0x45}

// sht3xReadStatus is the SHT3x command that reads its status register.
var sht3xReadStatus = []byte{0xf3, 0x2d}

// Found is one address that answered a scan.
type Found struct {
	Addr uint16 // the 7-bit address
	Chip string // the chip its registers identify, such as BME280; empty when not identified
	How  string // what identified Chip, such as "chip id 0x60"
	// Kinds are the registered kinds that can be strapped to Addr, by
	// name; only the one named after Chip when there is such a kind.
	Kinds []string
}

// Scan probes every address from 0x03 to 0x77 with a one-byte read, as
// i2cdetect -r does, and returns those that answered, in order. Each is
// named by the registered kinds whose Addresses hold it and, where one
// read tells, by its chip: the chip id at 0x76 and 0x77, the status
// register of an SHT3x at 0x44 and 0x45. Any error from a probe counts
// as no answer.
func Scan(bus i2c.Bus) []Found { return scan(bus, Kinds()) }

func scan(bus i2c.Bus, kinds []Kind) []Found {
	var found []Found
	var b [1]byte
	for addr := scanFirst; addr <= scanLast; addr++ {
		f := Found{Addr: addr}
		if err := bus.Tx(addr, nil, b[:]); err == nil {
			identifyBosch(bus, &f)
		} else if !identifySHT3x(bus, &f) {
			continue
		}
		for _, k := range kinds {
			if k.Bus == BusI2C && slices.Contains(k.Addresses, addr) {
				f.Kinds = append(f.Kinds, k.Name)
			}
		}
		if i := slices.Index(f.Kinds, strings.ToLower(f.Chip)); i >= 0 {
			f.Kinds = f.Kinds[i : i+1]
		}
		found = append(found, f)
	}
	return found
}

// identifyBosch names the chip at a Bosch sensor's address by its id.
func identifyBosch(bus i2c.Bus, f *Found) {
	if !slices.Contains(scanBoschAddrs, f.Addr) {
		return
	}
	var id [1]byte
	if bus.Tx(f.Addr, []byte{bmx280RegID}, id[:]) != nil {
		return
	}
	if chip, ok := scanBoschChips[id[0]]; ok {
		f.Chip, f.How = chip, fmt.Sprintf("chip id 0x%02x", id[0])
	}
}

// identifySHT3x asks an address that refused the read probe, if an SHT3x
// may hold it, for the status register, and reports whether a word with
// a valid CRC came back. The command and the read are two transactions,
// as the datasheet draws them.
func identifySHT3x(bus i2c.Bus, f *Found) bool {
	if !slices.Contains(scanSHT3xAddrs, f.Addr) {
		return false
	}
	var st [3]byte
	if bus.Tx(f.Addr, sht3xReadStatus, nil) != nil || bus.Tx(f.Addr, nil, st[:]) != nil {
		return false
	}
	if sensirionCRC(st[:2]) != st[2] {
		return false
	}
	f.Chip, f.How = "SHT3x", "status register"
	return true
}

// WriteGrid prints found as i2cdetect does, a row for every 16
// addresses with those that answered in hex and the others as --, and
// then one line for each address that answered with what is likely there.
func WriteGrid(w io.Writer, found []Found) error {
	var b bytes.Buffer
	at := make(map[uint16]bool, len(found))
	for _, f := range found {
		at[f.Addr] = true
	}
	b.WriteString("   ")
	for col := range 16 {
		fmt.Fprintf(&b, "  %x", col)
	}
	b.WriteByte('\n')
	for row := uint16(0); row < 0x80; row += 16 {
		fmt.Fprintf(&b, "%02x:", row)
		for addr := row; addr < row+16 && addr <= scanLast; addr++ {
			switch {
			case addr < scanFirst:
				b.WriteString("   ")
			case at[addr]:
				fmt.Fprintf(&b, " %02x", addr)
			default:
				b.WriteString(" --")
			}
		}
		b.WriteByte('\n')
	}
	if len(found) == 0 {
		b.WriteString("\nno device answered\n")
	} else {
		b.WriteByte('\n')
	}
	for _, f := range found {
		fmt.Fprintf(&b, "0x%02x  %s\n", f.Addr, f.describe())
	}
	_, err := w.Write(b.Bytes())
	return err
}

// describe is what WriteGrid says about one address.
func (f Found) describe() string {
	kinds := "no registered kind uses this address"
	if len(f.Kinds) > 0 {
		kinds = "likely kind " + strings.Join(f.Kinds, " or ")
	}
	if f.Chip == "" {
		return kinds
	}
	if len(f.Kinds) == 1 && f.Kinds[0] == strings.ToLower(f.Chip) {
		kinds = "kind " + f.Kinds[0]
	}
	return fmt.Sprintf("%s (%s): %s", f.Chip, f.How, kinds)
}
