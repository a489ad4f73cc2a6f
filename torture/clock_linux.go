package torture

import "golang.org/x/sys/unix"

// monoNow returns CLOCK_MONOTONIC in nanoseconds. Every process of the
// machine reads the same clock, so the holders' invoke and complete times
// and the parent's (reads, faults) are on one time line — unlike Go's own
// monotonic readings, which count from each process's start. A holder
// frozen between reading the clock and sending its request only widens the
// operation's interval, which makes every real-time check weaker, never
// wrong.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("torture: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
