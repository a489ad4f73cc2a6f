package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
