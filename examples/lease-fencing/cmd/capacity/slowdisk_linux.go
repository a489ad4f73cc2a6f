package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/leasefence/leasefence/examples/lease-fencing/internal/slowdisk"
)

// slowDiskMain is the slow-disk process: it mounts what slowDiskEnv says,
// prints slowDiskMounted, and unmounts when its stdin closes.
func slowDiskMain() int {
	args := strings.Split(os.Getenv(slowDiskEnv), "\n")
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "capacity slow-disk: started without "+slowDiskEnv+"; capacity -slow-disk starts it itself")
		return 2
	}
	delay, err := time.ParseDuration(args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "capacity slow-disk: delay:", err)
		return 2
	}
	d, err := slowdisk.Mount(args[0], args[1], delay)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capacity slow-disk:", err)
		return 1
	}
	fmt.Println(slowDiskMounted)
	io.Copy(io.Discard, os.Stdin)
	// The servers have stopped by now; an unmount that fails (a file
	// still open) is retried for a while before giving up.
	for range 50 {
		if err = d.Unmount(); err == nil {
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "capacity slow-disk:", err)
	return 1
}
