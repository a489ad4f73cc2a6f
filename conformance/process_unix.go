//go:build unix

package conformance

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
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

// notifyContinued starts listening for SIGCONT and returns a function that
// waits until it arrives (or ctx ends, or timeout passes) and stops
// listening. A holder calls it before it tells the parent where it is, so
// that the parent's SIGSTOP and SIGCONT that follow cannot be missed.
func notifyContinued(ctx context.Context, timeout time.Duration) (wait func() error) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCONT)
	return func() error {
		defer signal.Stop(ch)
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(timeout):
			return fmt.Errorf("no SIGCONT within %v", timeout)
		}
	}
}
