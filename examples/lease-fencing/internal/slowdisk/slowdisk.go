//go:build linux

// Package slowdisk mounts a directory that behaves like a slower disk: a
// FUSE passthrough to a directory on the machine's own file system whose
// fsync and fdatasync return only after a fixed delay, on top of the real
// flush. The capacity run (cmd/capacity -fsync-delay) puts its servers'
// data directories on one, to measure what a slower disk does to the
// renewal load, on a machine where a real one cannot be had: no
// device-mapper delay target, no cgroup I/O controller, and keeping the
// disk busy instead (dd oflag=dsync) costs a third of two CPUs.
//
// A delay, not a queue: concurrent flushes of different files each wait
// their own delay, as on a network block device whose latency is high but
// which serves several requests at once. Every flush still reaches the
// disk underneath, so durability is what it was, only slower. Reads and
// writes pass through FUSE unchanged; they cost the mounting process CPU
// (see the capacity docs for how much), which the delay does not.
//
// Mounting needs root (a direct mount(2), no fusermount) and /dev/fuse.
package slowdisk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// ErrUnavailable is returned by Mount when the machine cannot mount a FUSE
// file system here (not root, no /dev/fuse).
var ErrUnavailable = errors.New("slowdisk: FUSE mount unavailable")

// Disk is a mounted slow directory.
type Disk struct {
	server *fuse.Server
	dir    string
}

// Mount mounts at dir a passthrough to backing whose every fsync and
// fdatasync waits delay longer. dir and backing must be existing, distinct
// directories. The mount allows other users (PostgreSQL runs as postgres)
// and lets the kernel check permissions, as the backing directory's own
// file system would.
func Mount(dir, backing string, delay time.Duration) (*Disk, error) {
	if delay < 0 {
		return nil, fmt.Errorf("slowdisk: delay %v: must not be negative", delay)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: mounting needs root", ErrUnavailable)
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	f.Close()
	loopback, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("slowdisk: backing directory: %w", err)
	}
	server, err := fs.Mount(dir, &node{LoopbackNode: loopback.(*fs.LoopbackNode), delay: delay}, &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:        true,
			Options:           []string{"default_permissions"},
			FsName:            backing,
			Name:              "slowdisk",
			DirectMount:       true,
			DirectMountStrict: true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("slowdisk: mount %s: %w", dir, err)
	}
	return &Disk{server: server, dir: dir}, nil
}

// Dir is the mounted directory.
func (d *Disk) Dir() string { return d.dir }

// Unmount unmounts the directory; the files stay in the backing one. It
// fails while a process still has a file open there.
func (d *Disk) Unmount() error {
	if err := d.server.Unmount(); err != nil {
		return fmt.Errorf("slowdisk: unmount %s: %w", d.dir, err)
	}
	d.server.Wait()
	return nil
}

// node is a loopback node whose files flush slowly, and whose children
// are such nodes too (WrapChild: go-fuse wraps every node a node makes).
type node struct {
	*fs.LoopbackNode
	delay time.Duration
}

var (
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeWrapChilder = (*node)(nil)
)

func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), delay: n.delay}
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	return n.wrap(fh), fuseFlags, errno
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return ch, n.wrap(fh), fuseFlags, errno
}

func (n *node) wrap(fh fs.FileHandle) fs.FileHandle {
	if lf, ok := fh.(*fs.LoopbackFile); ok {
		return &file{LoopbackFile: lf, delay: n.delay}
	}
	return fh
}

// file flushes after its delay. Everything else is the loopback file's.
type file struct {
	*fs.LoopbackFile
	delay time.Duration
}

var _ fs.FileFsyncer = (*file)(nil)

// Fsync waits the delay, then flushes for real. The loopback file answers
// an fdatasync with an fsync too: a little more work on the disk
// underneath, never less.
//
// The wait ignores the request's context, which go-fuse cancels when the
// caller is interrupted by a signal: a disk's flush is not interruptible
// (the caller waits in uninterruptible sleep), and an fsync failing with
// EINTR is not something a database may survive: PostgreSQL PANICs on
// any fsync error, and did here when this returned EINTR to a backend
// that received one of the signals its latches use.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	time.Sleep(f.delay)
	return f.LoopbackFile.Fsync(ctx, flags)
}
