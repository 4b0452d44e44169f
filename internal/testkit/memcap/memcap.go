// Package memcap runs a process under a memory limit, as systemd's
// MemoryMax= does for the gateway's unit: a memory cgroup of its own,
// made under the test's own cgroup, with the process moved into it. It
// reads back what the cgroup reached (its peak, how often it hit the
// limit, whether the kernel's OOM killer ran in it), which counts what
// systemd counts: the process's anonymous memory and the page cache of
// the files it writes.
//
// Making a cgroup takes root and a writable cgroup file system: cgroup
// v1's memory hierarchy (memory.limit_in_bytes) or cgroup v2 with the
// memory controller delegated (memory.max). Where neither is possible New
// says why, and a test records that the cap was not applied and measures
// what it can without it, rather than skipping.
package memcap

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
)

// Root is where the cgroup file systems are mounted.
const Root = "/sys/fs/cgroup"

// Cap is one memory cgroup with a limit.
type Cap struct {
	dir    string
	parent string // the cgroup to move processes back to at Close
	v2     bool
	limit  int64
}

// Usage is what a Cap's cgroup reached.
type Usage struct {
	Limit    int64 // the limit set, bytes
	Current  int64 // bytes charged now
	Peak     int64 // the most bytes charged at once since New
	Failcnt  int64 // times the limit was hit (v1), or the kernel reclaimed at it (v2's "max" events)
	OOMKills int64 // processes the OOM killer ended in the cgroup; 0 when the kernel does not say
}

var seq atomic.Int64

// New makes a memory cgroup limited to limit bytes under the calling
// process's own, or returns an error that says why it cannot. Close
// removes it.
func New(limit int64) (*Cap, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("memcap: limit %d; want a positive number of bytes", limit)
	}
	name := fmt.Sprintf("fieldgate-memcap-%d-%d", os.Getpid(), seq.Add(1))
	if own, err := ownCgroup("memory"); err == nil {
		base := filepath.Join(Root, "memory")
		if _, err := os.Stat(filepath.Join(base, own, "memory.limit_in_bytes")); err == nil {
			return create(filepath.Join(base, own), name, false, limit)
		}
	}
	if own, err := ownCgroup(""); err == nil {
		base := Root
		if _, err := os.Stat(filepath.Join(Root, "unified", "cgroup.controllers")); err == nil {
			base = filepath.Join(Root, "unified")
		}
		ctl, err := os.ReadFile(filepath.Join(base, own, "cgroup.controllers"))
		if err == nil && bytes.Contains(ctl, []byte("memory")) {
			return create(filepath.Join(base, own), name, true, limit)
		}
	}
	return nil, errors.New("memcap: no writable memory cgroup: neither cgroup v1's memory hierarchy nor cgroup v2 with the memory controller is available to this process")
}

// ownCgroup returns this process's cgroup path in the hierarchy of
// controller, or in the v2 hierarchy for "".
func ownCgroup(controller string) (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2], nil
		}
		for _, c := range strings.Split(parts[1], ",") {
			if controller != "" && c == controller {
				return parts[2], nil
			}
		}
	}
	return "", fmt.Errorf("memcap: no %q line in /proc/self/cgroup", controller)
}

func create(parent, name string, v2 bool, limit int64) (*Cap, error) {
	dir := filepath.Join(parent, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("memcap: %w", err)
	}
	c := &Cap{dir: dir, parent: parent, v2: v2, limit: limit}
	file := "memory.limit_in_bytes"
	if v2 {
		file = "memory.max"
	}
	if err := c.write(file, strconv.FormatInt(limit, 10)); err != nil {
		_ = os.Remove(dir)
		return nil, err
	}
	if !v2 {
		// What a process added later had charged comes with it, so that
		// the cap counts its start too. Kernels that dropped the knob
		// refuse the write; the charge then stays behind, as on v2.
		_ = c.write("memory.move_charge_at_immigrate", "3")
	}
	return c, nil
}

func (c *Cap) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(c.dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("memcap: %w", err)
	}
	return nil
}

// String names the cgroup and its kind, for a test's record.
func (c *Cap) String() string {
	kind := "cgroup v1"
	if c.v2 {
		kind = "cgroup v2"
	}
	// Not the directory: it names the machine's own cgroup tree, which
	// says nothing about the gateway and would end up in reports.
	return fmt.Sprintf("%s, limit %d bytes", kind, c.limit)
}

// Add moves process pid into the cgroup. On cgroup v2, and on v1 kernels
// without memory.move_charge_at_immigrate, memory it had charged before
// stays charged where it was: add it before it does work.
func (c *Cap) Add(pid int) error {
	return c.write("cgroup.procs", strconv.Itoa(pid))
}

// Usage reads what the cgroup has reached so far.
func (c *Cap) Usage() (Usage, error) {
	u := Usage{Limit: c.limit}
	var err error
	num := func(file string) int64 {
		b, e := os.ReadFile(filepath.Join(c.dir, file))
		if e != nil {
			err = errors.Join(err, e)
			return 0
		}
		n, e := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if e != nil {
			err = errors.Join(err, fmt.Errorf("memcap: %s: %w", file, e))
		}
		return n
	}
	if c.v2 {
		u.Current = num("memory.current")
		if _, e := os.Stat(filepath.Join(c.dir, "memory.peak")); e == nil {
			u.Peak = num("memory.peak") // Linux 5.19 and later
		}
		ev := c.keyed("memory.events")
		u.Failcnt, u.OOMKills = ev["max"], ev["oom_kill"]
	} else {
		u.Current = num("memory.usage_in_bytes")
		u.Peak = num("memory.max_usage_in_bytes")
		u.Failcnt = num("memory.failcnt")
		u.OOMKills = c.keyed("memory.oom_control")["oom_kill"]
	}
	return u, err
}

// keyed reads a file of "key value" lines.
func (c *Cap) keyed(file string) map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(filepath.Join(c.dir, file))
	if err != nil {
		return out
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

// Close moves what still runs in the cgroup back to its parent and
// removes the cgroup.
func (c *Cap) Close() error {
	if b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs")); err == nil {
		for _, pid := range strings.Fields(string(b)) {
			_ = os.WriteFile(filepath.Join(c.parent, "cgroup.procs"), []byte(pid), 0)
		}
	}
	if err := os.Remove(c.dir); err != nil {
		return fmt.Errorf("memcap: %w", err)
	}
	return nil
}
