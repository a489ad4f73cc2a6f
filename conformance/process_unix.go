//go:build unix

package conformance

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// freeze sends SIGSTOP: every thread of the process stops, its renewal
// goroutine included, with no chance to notice.
func freeze(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }

// thaw sends SIGCONT.
func thaw(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }

// procState returns the state letter of a process from /proc/<pid>/stat
// ("T" when stopped by a signal, "S" sleeping, "R" running).
func procState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name, field 2, is in parentheses and may contain spaces;
	// the state is the first field after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) == 0 {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return f[0], nil
}
