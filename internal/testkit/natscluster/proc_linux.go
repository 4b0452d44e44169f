package natscluster

import (
	"os/exec"
	"syscall"
)

// configureProc has a server or reader killed with the test binary,
// should that die first.
func configureProc(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
