// Package gomodtest checks that the repository's modules work the way a
// user consumes them once they are tagged: required by version from a
// module proxy, with no replace directive, pulling into the user's module
// graph only what the packages they import need. It has no code of its
// own; see consumer_test.go.
package gomodtest
