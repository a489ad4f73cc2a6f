package command

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasefence/leasefence/leasecore"
)

func init() {
	commands = append(commands,
		&command{
			name: "status", args: "[NAME...]", needs: needLease, flags: []string{"limit"},
			summary: "who holds each lease, its token, and the time left by the server's clock",
			doc: `Shows, for each lease NAME, its state (held, released, expired, never-acquired;
on etcd, free), the holder, the latest token and the time left by the SERVER's clock
(PostgreSQL's now(); etcd's lessor, whole seconds rounded down). Without NAME,
shows every lease, as list does.`,
			run: runStatus,
		},
		&command{
			name: "list", needs: needLease, flags: []string{"limit"},
			summary: "every lease, as status shows it",
			doc: `Shows every lease in name order, at most --limit of them. On etcd a released or
expired lease has no key and is not listed (status NAME shows it as free).`,
			run: runStatus,
		},
		&command{
			name: "break", args: "NAME --scope SCOPE... (--yes | --confirm NAME)", needs: needBoth,
			flags:   []string{"scope", "yes", "confirm", "ttl", "holder"},
			summary: "end a lease's holding period now and fence its holder off",
			doc: `For an operator who must not wait out a TTL (a holder is wedged, or must be stopped
now). In one command, and in this order:

  1. Takes the lease NAME by force, as holder --holder, with a NEW token T larger than
     every token the lease has issued (PostgreSQL: token + 1, updating the lease row,
     never deleting it; etcd: the key is deleted while it still is the holding period
     read, and created again: a new revision). The previous holding period ends
     at once by the server's clock: its holder's next renew or release fails as lost.
  2. Advances the floor of every --scope to T, so the fence rejects every older token
     from now on, the previous holder's included, even if it does not notice step 1
     and writes before its local deadline.
  3. Releases the lease (token T), so the next holder acquires it at once, with a token
     larger than T, which the fence accepts.

Tokens never go down and are never issued twice. The lease's data is not touched. Name
every scope the lease fences with --scope: a scope left out still accepts the previous
holder's token. A scope whose floor is already above T is fenced by tokens of another
lease or backend (a token-space mix-up): it is reported, not changed, and the exit
status is 3. If another instance acquires the lease between steps (etcd only: between
the delete and the create), the scopes are advanced to that instance's token instead:
the previous holder is fenced off all the same, and the lease stays with the new
holder. If a step fails, the command says which steps were done and what to run
(re-running break is safe: it only issues another, larger token).

Requires --yes, or --confirm with the lease's name repeated.`,
			run: runBreak,
		},
	)
}

// runStatus is status and list.
func runStatus(ctx context.Context, r *runner, names []string) error {
	cmd := r.cmd.name
	if cmd == "list" && len(names) > 0 {
		return usagef(cmd, "list: takes no operands, got %q (status NAME shows one lease)", names)
	}
	if err := checkLimit(cmd, r.opts.limit, r.backend.maxList()); err != nil {
		return err
	}
	for _, n := range names {
		if err := checkName(cmd, "NAME", n); err != nil {
			return err
		}
	}
	var states []leasecore.LeaseState
	more := false
	if len(names) == 0 {
		var err error
		if states, err = r.backend.list(ctx, r.opts.limit); err != nil {
			return err
		}
		more = len(states) == r.opts.limit
	} else {
		for _, n := range names {
			st, err := r.backend.inspect(ctx, n)
			if err != nil {
				return err
			}
			states = append(states, st)
		}
	}
	kind := r.backend.kind()
	if r.opts.json {
		out := struct {
			Backend string      `json:"backend"`
			Leases  []leaseJSON `json:"leases"`
			More    bool        `json:"more"`
		}{Backend: kind, Leases: []leaseJSON{}, More: more}
		for _, st := range states {
			out.Leases = append(out.Leases, toLeaseJSON(kind, st))
		}
		return writeJSON(r.stdout, out)
	}
	t := newTable(r.stdout, "NAME", "STATE", "HOLDER", "TOKEN", "LEFT (server clock)")
	for _, st := range states {
		t.row(st.Name, leaseState(kind, st), st.Holder, tokenText(st.Token), leftText(st.Remaining))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if more {
		fmt.Fprintf(r.stderr, "leasefence: %s: showing the first %d leases; raise --limit for more\n", cmd, r.opts.limit)
	}
	return nil
}

// breakScope is one scope's outcome in break.
type breakScope struct {
	Scope    string `json:"scope"`
	Advanced bool   `json:"advanced"`
	Floor    uint64 `json:"floor"`
	Warning  string `json:"warning,omitempty"`
	Error    string `json:"error,omitempty"`
}

// runBreak is break: take over, advance every scope, release.
func runBreak(ctx context.Context, r *runner, operands []string) error {
	const cmd = "break"
	o := &r.opts
	if len(operands) != 1 {
		return usagef(cmd, "break: takes exactly one lease NAME, got %d operands", len(operands))
	}
	name := operands[0]
	if err := checkName(cmd, "NAME", name); err != nil {
		return err
	}
	if len(o.scopes) == 0 {
		return usagef(cmd, "break: --scope is required: name every scope the lease %q fences (a scope left out still accepts the old holder's token)", name)
	}
	switch {
	case o.set["confirm"] && o.confirm != name:
		return usagef(cmd, "break: --confirm %q does not match the lease NAME %q", o.confirm, name)
	case !o.yes && !o.set["confirm"]:
		return usagef(cmd, "break: refusing without --yes or --confirm %s: it ends %q's holding period now", name, name)
	}
	if err := r.backend.checkTTL(cmd, o.ttl); err != nil {
		return err
	}
	holder := r.operator()
	if err := checkName(cmd, "--holder", holder); err != nil {
		return err
	}

	out := struct {
		Backend  string       `json:"backend"`
		Lease    string       `json:"lease"`
		Ended    leaseJSON    `json:"ended"`
		Holder   string       `json:"holder"`
		Token    uint64       `json:"token"`
		Took     bool         `json:"took_over"`
		Winner   *leaseJSON   `json:"acquired_meanwhile_by,omitempty"`
		Scopes   []breakScope `json:"scopes"`
		Released bool         `json:"released"`
	}{Backend: r.backend.kind(), Lease: name, Holder: holder}

	// Step 1: take the lease with a new token.
	g, prev, err := r.backend.takeOver(ctx, name, holder, o.ttl)
	out.Ended = toLeaseJSON(r.backend.kind(), prev)
	target := g.Token
	if err != nil {
		var held *leasecore.HoldError
		if !errors.As(err, &held) || !errors.Is(err, leasecore.ErrHeld) {
			return fmt.Errorf("the take-over failed, nothing was advanced (the previous holding period may have been ended: run 'leasefence status %s'): %w", name, err)
		}
		// etcd: another instance acquired the lease between the delete and
		// the create. Its token is above the ended one: fence with it.
		st, ierr := r.backend.inspect(ctx, name)
		if ierr != nil || !st.Exists || st.Token <= prev.Token {
			return fmt.Errorf("the holding period with token %d was ended, but another instance acquired the lease meanwhile and it could not be read (%v): "+
				"run 'leasefence status %s' and 'leasefence advance SCOPE TOKEN' with its token: %w", prev.Token, ierr, name, err)
		}
		w := toLeaseJSON(r.backend.kind(), st)
		out.Winner, target = &w, st.Token
	} else {
		out.Took = true
	}
	out.Token = uint64(target)

	// Step 2: advance every scope to the new token. Bounded by the
	// command's context: a fence that does not answer is reported.
	warnings, failures := 0, 0
	for _, scope := range o.scopes {
		bs := breakScope{Scope: scope}
		// Our own grant's claim carries its token space, so the floor
		// records it and a floor of another lease service is named as such.
		claim := leasecore.Claim{Scope: scope, Writer: holder, Token: target}
		if out.Took {
			claim = g.Claim(scope)
		}
		res, err := r.backend.advance(ctx, claim)
		switch {
		case errors.Is(err, leasecore.ErrTokenSpace):
			warnings++
			bs.Floor = uint64(res.Floor)
			bs.Warning = fmt.Sprintf("floor %d was not changed: %v", res.Floor, err)
		case err != nil:
			failures++
			bs.Error = err.Error()
		case res.Accepted:
			bs.Advanced, bs.Floor = true, uint64(res.Floor)
		default:
			warnings++
			bs.Floor = uint64(res.Floor)
			bs.Warning = fmt.Sprintf("floor %d is above the new token %d: the scope is fenced by tokens of another lease or backend (a token-space mix-up); not changed", res.Floor, target)
		}
		out.Scopes = append(out.Scopes, bs)
	}

	// Step 3: release ours, even when the command's context is over: a
	// lease left held would make the next holder wait for the TTL.
	var relErr error
	if out.Took {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		relErr = r.backend.release(relCtx, g)
		cancel()
		out.Released = relErr == nil
	}

	if r.opts.json {
		if err := writeJSON(r.stdout, out); err != nil {
			return err
		}
	} else {
		r.printBreak(name, prev, g, out.Took, out.Winner, target, out.Scopes, out.Released)
	}
	switch {
	case failures > 0:
		return fmt.Errorf("%d of %d scopes were NOT advanced (see above): the previous holder's token %d may still be accepted there; "+
			"run 'leasefence advance SCOPE %d' for each", failures, len(o.scopes), prev.Token, target)
	case relErr != nil:
		return fmt.Errorf("the scopes were advanced, but the release of token %d failed: the lease frees itself after --ttl %v: %w", target, o.ttl, relErr)
	case warnings > 0:
		return errWarnings
	}
	return nil
}

func (r *runner) printBreak(name string, prev leasecore.LeaseState, g leasecore.Grant, took bool, winner *leaseJSON,
	target leasecore.Token, scopes []breakScope, released bool) {
	w := r.stdout
	kind := r.backend.kind()
	fmt.Fprintf(w, "break %s (%s)\n", name, kind)
	if prev.Held {
		fmt.Fprintf(w, "  ended:    holder %q, token %d, %s left by the server's clock\n", prev.Holder, prev.Token, leftText(prev.Remaining))
	} else {
		fmt.Fprintf(w, "  ended:    nothing was held (%s", leaseState(kind, prev))
		if prev.Token != 0 {
			fmt.Fprintf(w, ", last token %d", prev.Token)
		}
		fmt.Fprintln(w, ")")
	}
	if took {
		fmt.Fprintf(w, "  took:     token %d as %q\n", g.Token, g.Holder)
	} else {
		fmt.Fprintf(w, "  meanwhile: %q acquired the lease with token %d; fencing with its token\n", winner.Holder, winner.Token)
	}
	for _, s := range scopes {
		switch {
		case s.Error != "":
			fmt.Fprintf(w, "  scope %s: NOT advanced: %s\n", s.Scope, s.Error)
		case s.Warning != "":
			fmt.Fprintf(w, "  scope %s: WARNING: %s\n", s.Scope, s.Warning)
		default:
			fmt.Fprintf(w, "  scope %s: floor %d: tokens below %d are rejected from now on\n", s.Scope, s.Floor, target)
		}
	}
	switch {
	case released:
		fmt.Fprintf(w, "  released: token %d; the next acquire gets a larger token\n", target)
	case took:
		fmt.Fprintf(w, "  NOT released: token %d stays held until its TTL ends\n", target)
	}
}
