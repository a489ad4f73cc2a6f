package main

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// Linux everywhere).
const clockTick = 10 * time.Millisecond

// serverCPU returns the CPU time (user + system) the server processes have
// used so far: the roots, every descendant alive now, and the children the
// roots have reaped (cutime, cstime: PostgreSQL backends of closed
// connections). Negative when /proc cannot be read; a cross-check, not a
// figure any ratio rests on (see cores).
func serverCPU(roots []int) time.Duration {
	if len(roots) == 0 {
		return 0
	}
	type proc struct{ ppid, ticks, reaped int64 }
	procs := map[int]proc{}
	// Reading /proc can fail part way when a process goes away under the
	// cursor (ENOENT from getdents): read it again.
	var entries []os.DirEntry
	var err error
	for range 5 {
		if entries, err = os.ReadDir("/proc"); err == nil {
			break
		}
	}
	if err != nil {
		return -1
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command is in parentheses and may hold spaces: fields start
		// after the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 15 { // f[0] is field 3 (state)
			continue
		}
		num := func(k int) int64 { n, _ := strconv.ParseInt(f[k-3], 10, 64); return n }
		procs[pid] = proc{ppid: num(4), ticks: num(14) + num(15), reaped: num(16) + num(17)}
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	// Descendants: repeat until no process joins (trees here are shallow).
	for changed := true; changed; {
		changed = false
		for pid, p := range procs {
			if !in[pid] && in[int(p.ppid)] {
				in[pid], changed = true, true
			}
		}
	}
	var ticks int64
	for pid := range in {
		p, ok := procs[pid]
		if !ok {
			continue
		}
		ticks += p.ticks
		if isRoot(pid, roots) {
			ticks += p.reaped
		}
	}
	return time.Duration(ticks) * clockTick
}

func isRoot(pid int, roots []int) bool {
	for _, r := range roots {
		if r == pid {
			return true
		}
	}
	return false
}

// postmasterPID reads the postmaster's PID from the data directory (first
// line of postmaster.pid); 0 when it cannot.
func postmasterPID(dataDir string) int {
	if dataDir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// cores returns the CPU seconds per second between two serverCPU readings
// over elapsed; NaN when either reading failed or they went backwards.
func cores(before, after time.Duration, elapsed time.Duration) float64 {
	// A reading that went backwards (seen now and then in a PostgreSQL
	// phase's window, cause not found) is no reading either.
	if before < 0 || after < before || elapsed <= 0 {
		return math.NaN()
	}
	return (after - before).Seconds() / elapsed.Seconds()
}
