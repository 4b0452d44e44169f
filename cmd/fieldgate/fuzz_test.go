package main

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
)

// FuzzReadPassword reads a password from arbitrary standard input, as
// fieldgate passwd does. The password is the first line without its line
// ending (\n or \r\n), in full: never cut short, never empty, never
// longer than a line may be, and nothing after the first line counts.
//
//	go test -run '^$' -fuzz FuzzReadPassword -fuzztime 15s ./cmd/fieldgate
func FuzzReadPassword(f *testing.F) {
	for _, s := range []string{
		"s3cret\n", "s3cret\r\n", "s3cret", "\n", "", "a\nb\n", "\r\n", "pw\r", "\x00\xff\n",
		strings.Repeat("x", maxPasswordLine-1) + "\n", strings.Repeat("x", maxPasswordLine), strings.Repeat("x", maxPasswordLine+1),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stdin []byte) {
		pw, err := readPassword(bytes.NewReader(stdin), io.Discard)
		line, _, _ := bytes.Cut(stdin, []byte("\n"))
		want := bytes.TrimSuffix(line, []byte("\r"))
		switch {
		case len(line) >= maxPasswordLine:
			if err == nil {
				t.Fatalf("a first line of %d bytes gave a password of %d", len(line), len(pw))
			}
		case len(want) == 0:
			if !errors.Is(err, auth.ErrEmptyPassword) {
				t.Fatalf("an empty first line gave %q, %v", pw, err)
			}
		case err != nil:
			t.Fatalf("first line %q: %v", line, err)
		case !bytes.Equal(pw, want):
			t.Fatalf("first line %q gave password %q", line, pw)
		}
	})
}
