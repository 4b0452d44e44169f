package reliability

import (
	"os/exec"
	"syscall"
)

func init() {
	// A gateway left running by a test binary that died (a timeout's
	// panic, a kill) would hold the port and the state file: the kernel
	// kills it when the test binary goes.
	configureProc = func(cmd *exec.Cmd) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
}
