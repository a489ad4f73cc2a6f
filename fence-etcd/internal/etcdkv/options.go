package etcdkv

import (
	"fmt"

	"github.com/leasefence/leasefence/leasecore"
)

// Options are the settings a fenceetcd.Option changes. The zero value is
// not ready for use: start from NewOptions.
type Options struct {
	Prefix string
	// SharedLeases is fenceetcd.WithSharedLeases: only NewLeaseStore reads
	// it.
	SharedLeases bool
	// AttemptLog is fenceetcd.WithAttemptLog: only NewFence and
	// NewResource read it.
	AttemptLog leasecore.AttemptLog
	// FenceObserver is fenceetcd.WithFenceObserver (and WithLogger): only
	// NewFence and NewResource read it. Nil: no observer.
	FenceObserver func(leasecore.FenceEvent)
}

// NewOptions returns the defaults.
func NewOptions() Options { return Options{Prefix: DefaultPrefix} }

// applyOptions is the function fenceetcd registered with RegisterOptions: a
// func(op string, opts []O) (Options, Layout, error) with O fenceetcd.Option.
var applyOptions any

// RegisterOptions is called once by package fenceetcd, at initialization,
// with the function that applies and validates its options.
//
// fenceetcd.Option is a func over a type fenceetcd keeps to itself, so that
// its godoc names nothing a user cannot see; only fenceetcd can call one.
// etcdcontrol.New takes the same options and needs them applied, and this
// package cannot import fenceetcd (fenceetcd imports it), so fenceetcd
// hands the function over here. etcdcontrol imports fenceetcd (it names
// fenceetcd.Option), so fenceetcd's initialization has run before
// etcdcontrol can call ApplyOptions.
func RegisterOptions[O any](apply func(op string, opts []O) (Options, Layout, error)) {
	applyOptions = apply
}

// ApplyOptions applies opts, fenceetcd's options, with the function
// fenceetcd registered, and returns the settings and their validated
// layout; op names the caller in the error.
func ApplyOptions[O any](op string, opts []O) (Options, Layout, error) {
	apply, ok := applyOptions.(func(string, []O) (Options, Layout, error))
	if !ok {
		// Only a change to fenceetcd's registration can get here.
		panic(fmt.Sprintf("etcdkv: no function registered for options of type %T", opts))
	}
	return apply(op, opts)
}
