//go:build !linux

package main

import (
	"fmt"
	"os"
)

func slowDiskMain() int {
	fmt.Fprintln(os.Stderr, "capacity slow-disk: FUSE slow disks are Linux-only")
	return 1
}
