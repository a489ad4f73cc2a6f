package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// slowDiskArg is the subcommand that mounts a slow disk (internal/slowdisk)
// in a process of its own: its FUSE requests are then served by a process
// that neither the servers nor this one's clients share a Go runtime with
// (this one's garbage collection would otherwise stall the servers'
// flushes).
const slowDiskArg = "slow-disk"

// slowDiskMounted is the line the slow-disk process prints once mounted.
const slowDiskMounted = "mounted"

// slowDiskEnv carries the slow-disk process's mount point, backing
// directory and delay, separated by newlines.
const slowDiskEnv = "LEASEFENCE_CAPACITY_SLOW_DISK"

// slowDisk is a mounted slow disk and the process serving it.
type slowDisk struct {
	top   string // what startSlowDisk made: the mount point and the backing directory
	mount string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error
}

// startSlowDisk mounts a slow disk with the given delay under os.TempDir()
// and returns it once mounted. Its directories are world-writable with the
// sticky bit, as /tmp is: PostgreSQL runs as postgres.
//
// exe and args start the slow-disk process (this binary and slowDiskArg).
func startSlowDisk(ctx context.Context, exe string, args []string, delay time.Duration) (_ *slowDisk, err error) {
	top, err := os.MkdirTemp("", "capacity-slow-disk-")
	if err != nil {
		return nil, err
	}
	d := &slowDisk{top: top, mount: filepath.Join(top, "mount"), done: make(chan error, 1)}
	backing := filepath.Join(top, "backing")
	defer func() {
		if err != nil {
			os.RemoveAll(top)
		}
	}()
	for _, dir := range []string{top, d.mount, backing} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := os.Chmod(dir, 0o1777); err != nil {
			return nil, err
		}
	}
	d.cmd = exec.Command(exe, args...)
	d.cmd.Env = append(os.Environ(), slowDiskEnv+"="+strings.Join([]string{d.mount, backing, delay.String()}, "\n"))
	d.cmd.Stderr = os.Stderr
	if d.stdin, err = d.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		s.Scan()
		line <- s.Text()
		io.Copy(io.Discard, out)
		d.done <- d.cmd.Wait()
	}()
	select {
	case l := <-line:
		switch l {
		case slowDiskMounted:
			return d, nil
		case "":
			err = errors.New("slow disk: the mounting process ended before it mounted (its error is above)")
		default:
			err = fmt.Errorf("slow disk: the mounting process said %q", l)
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	d.stdin.Close()
	d.cmd.Process.Kill()
	return nil, errors.Join(err, <-d.done)
}

// useSlowDisk mounts -slow-disk's disk and points TMPDIR at it, where
// pgtemp and etcdtemp make the servers' directories; undo puts TMPDIR back
// and unmounts the disk (the servers have stopped by then).
func useSlowDisk(ctx context.Context, cfg config, say func(string, ...any)) (undo func(), err error) {
	disk, err := startSlowDisk(ctx, cfg.exe, cfg.slowDiskArgs, *cfg.slowDisk)
	if err != nil {
		return nil, err
	}
	say("slow disk mounted at %s (fsync +%v); the servers' data go there", disk.mount, *cfg.slowDisk)
	tmp, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", disk.mount)
	return func() {
		if had {
			os.Setenv("TMPDIR", tmp)
		} else {
			os.Unsetenv("TMPDIR")
		}
		if err := disk.stop(); err != nil {
			say("%v", err)
		}
	}, nil
}

// stop unmounts the disk (closing the process's stdin tells it to) and
// removes its directories.
func (d *slowDisk) stop() error {
	d.stdin.Close()
	var err error
	select {
	case err = <-d.done:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		err = errors.Join(errors.New("slow disk: the mounting process did not unmount within 30 s"), <-d.done)
	}
	if err != nil {
		return fmt.Errorf("slow disk: %w", err)
	}
	return os.RemoveAll(d.top)
}
