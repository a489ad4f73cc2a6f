//go:build linux

package slowdisk

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func mount(t *testing.T, delay time.Duration) (*Disk, string) {
	t.Helper()
	dir, backing := t.TempDir(), t.TempDir()
	d, err := Mount(dir, backing, delay)
	if errors.Is(err, ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return d, backing
}

// syncTime is how long f.Sync takes.
func syncTime(t *testing.T, f *os.File) time.Duration {
	t.Helper()
	if _, err := f.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return time.Since(began)
}

// TestFsyncWaitsTheDelay: a file created on the mount, one opened there
// and one created two directories down all take at least the delay to
// flush, and what was written is in the backing directory.
func TestFsyncWaitsTheDelay(t *testing.T) {
	const delay = 30 * time.Millisecond
	d, backing := mount(t, delay)
	path := filepath.Join(d.Dir(), "wal")
	created, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if took := syncTime(t, created); took < delay {
		t.Errorf("fsync of a created file took %v, want at least %v", took, delay)
	}
	if err := created.Close(); err != nil {
		t.Fatal(err)
	}
	opened, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer opened.Close()
	if took := syncTime(t, opened); took < delay {
		t.Errorf("fsync of an opened file took %v, want at least %v", took, delay)
	}
	if got, err := os.ReadFile(filepath.Join(backing, "wal")); err != nil || string(got) != "xx" {
		t.Errorf("backing file: %q, %v; want \"xx\"", got, err)
	}
	// Deeper down too (PostgreSQL's WAL is in data/pg_wal).
	sub := filepath.Join(d.Dir(), "data", "pg_wal")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	nested, err := os.Create(filepath.Join(sub, "segment"))
	if err != nil {
		t.Fatal(err)
	}
	defer nested.Close()
	if took := syncTime(t, nested); took < delay {
		t.Errorf("fsync of a file two directories down took %v, want at least %v", took, delay)
	}
}

// TestNoDelay: with no delay a flush does not wait (the control the
// delayed mount is compared with).
func TestNoDelay(t *testing.T) {
	d, _ := mount(t, 0)
	f, err := os.Create(filepath.Join(d.Dir(), "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 3 {
		if took := syncTime(t, f); took < 30*time.Millisecond {
			return
		}
	}
	t.Error("three flushes without a delay each took 30 ms or more")
}

func TestBadInput(t *testing.T) {
	if _, err := Mount(t.TempDir(), t.TempDir(), -time.Millisecond); err == nil {
		t.Error("a negative delay mounted")
	}
}

// TestFsyncNotInterrupted: a signal to the thread waiting in fsync (the
// kernel then sends FUSE an interrupt, and go-fuse cancels the request's
// context) does not fail the flush. PostgreSQL PANICs on an fsync that
// fails with EINTR, as a disk's never does.
func TestFsyncNotInterrupted(t *testing.T) {
	const delay = 300 * time.Millisecond
	d, _ := mount(t, delay)
	f, err := os.Create(filepath.Join(d.Dir(), "wal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tid := make(chan int, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- syscall.Gettid()
		// syscall.Fsync, not f.Sync: f.Sync retries on EINTR.
		errc <- syscall.Fsync(int(f.Fd()))
	}()
	thread := <-tid
	signals := 0
	for {
		select {
		case err := <-errc:
			if signals == 0 {
				t.Fatal("the flush ended before a signal was sent")
			}
			if err != nil {
				t.Fatalf("fsync with %d signals to its thread: %v", signals, err)
			}
			return
		case <-time.After(20 * time.Millisecond):
			// SIGURG: the Go runtime's own preemption signal, harmless.
			if err := syscall.Tgkill(os.Getpid(), thread, syscall.SIGURG); err != nil {
				t.Fatal(err)
			}
			signals++
		}
	}
}
