package memcap

import (
	"os/exec"
	"testing"
	"time"

	"github.com/fieldgate/fieldgate/internal/testkit"
)

// TestCapKills: a process that allocates past the cap is killed by the
// kernel, and the cap says it was. Where no cgroup can be made, the test
// says so and checks that New explains why.
func TestCapKills(t *testing.T) {
	c, err := New(32 << 20)
	if err != nil {
		if err.Error() == "" {
			t.Fatal("New failed without saying why")
		}
		t.Skipf("no memory cgroup on this machine: %v", err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	// 64 MiB of touched memory in a shell tool every system has: the
	// allocation is python-free and compiler-free.
	cmd := exec.Command("sh", "-c", "read x; head -c 67108864 /dev/zero | tail -c 67108864 >/dev/null")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	stdin.Close() // now it may allocate; its children inherit the cgroup
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(testkit.Scale(30 * time.Second)):
		_ = cmd.Process.Kill()
		t.Fatal("the capped process did not end")
	}
	u, err := c.Usage()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %+v", c, u)
	if u.Peak == 0 || u.Peak > 32<<20 {
		t.Errorf("peak %d, want between 0 and the cap", u.Peak)
	}
	if u.Failcnt == 0 && u.OOMKills == 0 {
		t.Errorf("the cap was never hit: %+v", u)
	}
}
