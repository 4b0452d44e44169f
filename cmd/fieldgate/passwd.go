package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/fieldgate/fieldgate/gateway/broker/auth"
)

const passwdUsage = `usage: fieldgate passwd [-D] FILE USER

Sets USER's password in the password file FILE (broker.password_file),
creating FILE if it is missing. The password is the first line of standard
input; printf is a shell builtin, so the password stays out of the process
list:

  printf '%s\n' "$PW" | fieldgate passwd /etc/fieldgate/passwd sensor1

At a terminal the password is shown as it is typed. To hide it, read it
into a variable first:

  read -rs PW && printf '%s\n' "$PW" | fieldgate passwd FILE USER

Passwords are 1 to 72 bytes. Every other line of FILE is kept as it was,
and FILE is replaced atomically. The broker reads FILE when it starts and
when it reloads (SIGHUP, systemctl reload fieldgate): then removed users
and old passwords are refused, for MQTT and the ops endpoint alike, and
their connected clients are disconnected.

flags:
`

// maxPasswordLine bounds what is read from standard input: well past the
// longest password bcrypt uses, so that a longer one is refused as too long
// rather than cut short.
const maxPasswordLine = 1024

// cmdPasswd sets or deletes a user in a password file.
func cmdPasswd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fieldgate passwd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	del := fs.Bool("D", false, "delete USER instead of setting a password")
	fs.Usage = func() {
		io.WriteString(fs.Output(), passwdUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 2 {
		fmt.Fprintf(stderr, "fieldgate passwd: want FILE and USER, got %d arguments\n\n", fs.NArg())
		fs.Usage()
		return exitUsage
	}
	path, user := fs.Arg(0), fs.Arg(1)

	if *del {
		if err := auth.DeleteUser(path, user); err != nil {
			fmt.Fprintf(stderr, "fieldgate passwd: %v\n", err)
			return exitFail
		}
		fmt.Fprintf(stdout, "%s: deleted %q\n", path, user)
		return 0
	}

	// Refuse a bad name before asking for a password that would be wasted.
	if err := auth.ValidateUsername(user); err != nil {
		fmt.Fprintf(stderr, "fieldgate passwd: set password of %q in %s: %v\n", user, path, err)
		return exitFail
	}
	password, err := readPassword(stdin, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "fieldgate passwd: set password of %q in %s: %v\n", user, path, err)
		return exitFail
	}
	defer clear(password)
	if err := auth.SetPassword(path, user, password); err != nil {
		fmt.Fprintf(stderr, "fieldgate passwd: %v\n", err)
		return exitFail
	}
	fmt.Fprintf(stdout, "%s: password set for %q\n", path, user)
	return 0
}

// readPassword returns the first line of stdin without its line ending.
// None of our dependencies turns terminal echo off, so at a terminal it
// says that the password will show, and where to read how to hide it.
func readPassword(stdin io.Reader, stderr io.Writer) ([]byte, error) {
	if f, ok := stdin.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprint(stderr, "The password shows as you type; to hide it, see fieldgate passwd -h.\nPassword: ")
		}
	}
	r := bufio.NewReaderSize(io.LimitReader(stdin, maxPasswordLine), maxPasswordLine)
	line, err := r.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, fmt.Errorf("the password line is longer than %d bytes", maxPasswordLine)
	case err != nil && err != io.EOF:
		return nil, fmt.Errorf("read the password from standard input: %w", err)
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		return nil, auth.ErrEmptyPassword
	}
	// The reader's buffer is dropped; the caller clears this copy.
	return bytes.Clone(line), nil
}
