//go:build !linux

package natscluster

import "os/exec"

// configureProc does nothing where the kernel cannot kill a child with
// its parent; the test's cleanup still ends it.
func configureProc(*exec.Cmd) {}
