//go:build !linux

package pgconformance

import "os/exec"

func setHolderProcAttr(*exec.Cmd) {}
