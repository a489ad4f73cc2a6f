package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/leasefence/leasefence/leasecore"
)

// HolderSelfCommand returns an unstarted command that runs the running
// binary again with args, with the environment variable envKey set to spec
// encoded as JSON: the helper-process idiom that HolderProcesses
// implementations use, so holder processes need no separate build. The
// binary must call HolderSpec(envKey, ...) early (a test binary in
// TestMain, a command in a subcommand) and then run RunHolder. On Linux
// the holder dies with its parent, so a killed run leaves none behind.
func HolderSelfCommand(ctx context.Context, args []string, envKey string, spec any) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("conformance: holder command: %w", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("conformance: holder command: %w", err)
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(os.Environ(), envKey+"="+string(b))
	setHolderProcAttr(cmd)
	return cmd, nil
}

// HolderSpec decodes into spec the JSON that HolderSelfCommand put in the
// environment variable envKey. ok is false when the variable is unset:
// this process is not a holder.
func HolderSpec(envKey string, spec any) (ok bool, err error) {
	v, set := os.LookupEnv(envKey)
	if !set || v == "" {
		return false, nil
	}
	if err := json.Unmarshal([]byte(v), spec); err != nil {
		return true, fmt.Errorf("conformance: holder spec %s: %w", envKey, err)
	}
	return true, nil
}

// HolderOpener opens the lease service and the resource a holder process
// uses; closeAll releases whatever it opened. It runs after the spec was
// decoded (see HolderMain).
type HolderOpener func(ctx context.Context) (lease leasecore.Lease, res leasecore.FencedResource, closeAll func(), err error)

// HolderMain is the whole main function of a holder process started by
// HolderSelfCommand: it decodes the JSON in envKey into spec, opens the
// backend with open, runs RunHolder on stdin and stdout until EXIT or the
// end of stdin, and returns the exit code. SIGTERM ends it cleanly;
// SIGSTOP and SIGCONT are the experiment and cannot be caught.
func HolderMain(envKey string, spec any, open HolderOpener) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "holder (%s): %v\n", envKey, err)
		return 1
	}
	ok, err := HolderSpec(envKey, spec)
	if err != nil {
		return fail(err)
	}
	if !ok {
		return fail(fmt.Errorf("%s is not set: the suite starts holder processes itself", envKey))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	lease, res, closeAll, err := open(ctx)
	if err != nil {
		return fail(err)
	}
	defer closeAll()
	if err := RunHolder(ctx, lease, res, os.Stdin, os.Stdout); err != nil {
		return fail(err)
	}
	return 0
}
