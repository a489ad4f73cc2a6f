//go:build !linux

package etcdconformance

import "os/exec"

func setHolderProcAttr(*exec.Cmd) {}
