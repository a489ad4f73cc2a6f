package command

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/leasefence/leasefence/leasecore"
	"github.com/leasefence/leasefence/leasecore/backendkit"
)

func init() {
	commands = append(commands,
		&command{
			name: "floors", args: "[SCOPE[=LEASE]...]", needs: needBoth, flags: []string{"limit"},
			summary: "each scope's floor, with a warning for a token-space mix-up",
			doc: `Shows the floor of each SCOPE (without SCOPE: of every scope, in scope order): the
largest token its fence has accepted; tokens below it are rejected.

When the lease service is reachable, each floor is checked against the tokens its
lease has issued: the lease LEASE, or, without =LEASE, the lease named like the scope.
A floor above every token the lease can have issued was not set by that lease's
tokens: the scope is fenced by another lease or another backend (a token-space
mix-up), and its holders' writes are all rejected. Such a floor is a WARNING and the
exit status is 3. PostgreSQL: the bound is the lease's latest token (a scope named
like no lease is not checked unless =LEASE names one). etcd: the token of the lease's
current holding period when it is held, otherwise the cluster's revision, which no
token of the cluster exceeds. If the lease service cannot be reached, the floors are
shown unchecked and a note says why (exit status 0).`,
			run: runFloors,
		},
		&command{
			name: "attempts", args: "SCOPE", needs: needFence, flags: []string{"rejected", "since", "limit"},
			summary: "the scope's attempt log: the stale writes its fence rejected",
			doc: `Shows the attempt log of SCOPE, oldest first: each entry's time, writer, token,
outcome and the floor after it. With --rejected, only rejected attempts: the stale
writes the fence turned away, each one a split brain averted. Which attempts are
logged is the writers' choice (the libraries' WithAttemptLog; rejected ones by
default). Times are the database's clock on PostgreSQL and the writers' clocks on
etcd.`,
			run: runAttempts,
		},
		&command{
			name: "advance", args: "SCOPE TOKEN", needs: needBoth, flags: []string{"lease", "force", "writer"},
			summary: "raise a scope's floor to TOKEN: fence off every older token now",
			doc: `Raises the floor of SCOPE to TOKEN, as a new holder does right after acquiring:
from now on the fence rejects every token below TOKEN. A floor already at or above
TOKEN is left as it is (the floor never goes down) and the command says so; exit
status 0 either way.

TOKEN is checked first against the tokens the scope's lease (--lease, default the
lease named like the scope) has issued: advancing above them would reject the current
holder and, on PostgreSQL, every next holder until the lease's tokens catch up. Such
a TOKEN is refused (exit status 1) unless --force; so is any TOKEN when the lease
service cannot be reached. To end the current holder's period as well, use break.`,
			run: runAdvance,
		},
		&command{
			name: "prune-attempts", args: "--older-than DURATION [SCOPE...]", needs: needFence, flags: []string{"older-than"},
			summary: "delete attempt-log entries older than a duration",
			doc: `Deletes the entries of each SCOPE's attempt log logged more than DURATION ago
(without SCOPE: of every scope that has a floor, which is every scope whose fence has
logged an attempt). Floors are never deleted.`,
			run: runPrune,
		},
	)
}

// floorRow is one scope in floors' output.
type floorRow struct {
	Scope      string `json:"scope"`
	Floor      uint64 `json:"floor"`
	Lease      string `json:"lease"`
	LeaseBound uint64 `json:"lease_bound"`
	Check      string `json:"check"` // ok, warning, unchecked, no-floor
	Message    string `json:"message,omitempty"`
}

func runFloors(ctx context.Context, r *runner, operands []string) error {
	const cmd = "floors"
	if err := checkLimit(cmd, r.opts.limit, r.backend.maxList()); err != nil {
		return err
	}
	type target struct {
		scope, lease string
		explicit     bool
	}
	var targets []target
	for _, op := range operands {
		t := target{scope: op, lease: op}
		if i := strings.LastIndex(op, "="); i >= 0 {
			t = target{scope: op[:i], lease: op[i+1:], explicit: true}
		}
		if err := checkName(cmd, "SCOPE", t.scope); err != nil {
			return err
		}
		if err := checkName(cmd, "LEASE", t.lease); err != nil {
			return err
		}
		targets = append(targets, t)
	}
	var rows []floorRow
	more := false
	if len(targets) == 0 {
		all, err := r.backend.floors(ctx, r.opts.limit)
		if err != nil {
			return err
		}
		more = len(all) == r.opts.limit
		for _, f := range all {
			targets = append(targets, target{scope: f.Scope, lease: f.Scope})
			rows = append(rows, floorRow{Scope: f.Scope, Floor: uint64(f.Floor), Lease: f.Scope})
		}
	} else {
		for _, t := range targets {
			floor, err := r.backend.floor(ctx, t.scope)
			if err != nil {
				return err
			}
			rows = append(rows, floorRow{Scope: t.scope, Floor: uint64(floor), Lease: t.lease})
		}
	}

	// The checks: bounded on their own, so that a lease service that does
	// not answer still leaves time to print the floors.
	checkCtx, cancel := context.WithTimeout(ctx, min(5*time.Second, r.opts.timeout))
	defer cancel()
	type bound struct {
		token leasecore.Token
		desc  string
		known bool
	}
	bounds := map[string]bound{}
	var unreachable error
	warnings, checked := 0, true
	for i := range rows {
		row, t := &rows[i], targets[i]
		if row.Floor == 0 {
			row.Check, row.Message = "no-floor", "the scope has accepted no token yet"
			continue
		}
		if unreachable != nil {
			row.Check, row.Message, checked = "unchecked", unreachable.Error(), false
			continue
		}
		key := fmt.Sprintf("%t/%s", t.explicit, t.lease)
		b, ok := bounds[key]
		if !ok {
			token, desc, known, err := r.backend.tokenBound(checkCtx, t.lease, t.explicit)
			if err != nil {
				row.Check, row.Message, checked = "unchecked", "lease service: "+err.Error(), false
				if checkCtx.Err() != nil || errors.Is(err, leasecore.ErrUnavailable) ||
					errors.Is(err, leasecore.ErrSchema) || errors.Is(err, leasecore.ErrConfig) {
					unreachable = fmt.Errorf("lease service: %w", err)
				}
				continue
			}
			b = bound{token, desc, known}
			bounds[key] = b
		}
		row.LeaseBound = uint64(b.token)
		switch {
		case !b.known:
			row.Check, row.Message = "unchecked", b.desc
		case row.Floor > uint64(b.token):
			warnings++
			row.Check = "warning"
			row.Message = fmt.Sprintf("floor %d is above every token its lease can have issued (%s): a token-space mix-up — "+
				"the scope is fenced by another lease or backend, and this lease's holders are rejected", row.Floor, b.desc)
		default:
			row.Check, row.Message = "ok", b.desc
		}
	}

	if r.opts.json {
		out := struct {
			Backend  string     `json:"backend"`
			Floors   []floorRow `json:"floors"`
			Warnings int        `json:"warnings"`
			Checked  bool       `json:"checked"`
			More     bool       `json:"more"`
		}{r.backend.kind(), rows, warnings, checked, more}
		if out.Floors == nil {
			out.Floors = []floorRow{}
		}
		if err := writeJSON(r.stdout, out); err != nil {
			return err
		}
	} else {
		t := newTable(r.stdout, "SCOPE", "FLOOR", "LEASE", "CHECK")
		for _, row := range rows {
			t.row(row.Scope, tokenText(leasecore.Token(row.Floor)), row.Lease, row.Check)
		}
		if err := t.flush(); err != nil {
			return err
		}
		for _, row := range rows {
			if row.Check == "warning" {
				fmt.Fprintf(r.stdout, "WARNING: scope %s: %s\n", row.Scope, row.Message)
			}
		}
		if unreachable != nil {
			fmt.Fprintf(r.stderr, "leasefence: floors: not checked: %v\n", unreachable)
		}
		if more {
			fmt.Fprintf(r.stderr, "leasefence: floors: showing the first %d scopes; raise --limit for more\n", r.opts.limit)
		}
	}
	if warnings > 0 {
		return errWarnings
	}
	return nil
}

func runAttempts(ctx context.Context, r *runner, operands []string) error {
	const cmd = "attempts"
	if len(operands) != 1 {
		return usagef(cmd, "attempts: takes exactly one SCOPE, got %d operands", len(operands))
	}
	scope := operands[0]
	if err := checkName(cmd, "SCOPE", scope); err != nil {
		return err
	}
	if err := checkLimit(cmd, r.opts.limit, backendkit.MaxAttemptsRead); err != nil {
		return err
	}
	since, err := sinceTime(cmd, r.opts.since, time.Now())
	if err != nil {
		return err
	}
	list, err := r.backend.attempts(ctx, leasecore.AttemptQuery{Scope: scope, Since: since, Limit: r.opts.limit}, r.opts.rejected)
	if err != nil {
		return err
	}
	if r.opts.json {
		out := struct {
			Backend  string        `json:"backend"`
			Scope    string        `json:"scope"`
			Since    *time.Time    `json:"since"`
			Rejected bool          `json:"rejected_only"`
			Attempts []attemptJSON `json:"attempts"`
			More     bool          `json:"more"`
		}{Backend: r.backend.kind(), Scope: scope, Rejected: r.opts.rejected, Attempts: []attemptJSON{}, More: len(list) == r.opts.limit}
		if !since.IsZero() {
			out.Since = &since
		}
		for _, a := range list {
			out.Attempts = append(out.Attempts, attemptJSON{At: a.At, Scope: a.Scope, Part: a.Part, Writer: a.Writer,
				Token: uint64(a.Token), Accepted: a.Accepted, Floor: uint64(a.Floor)})
		}
		return writeJSON(r.stdout, out)
	}
	t := newTable(r.stdout, "AT", "WRITER", "TOKEN", "RESULT", "FLOOR", "PART")
	for _, a := range list {
		result := "rejected"
		if a.Accepted {
			result = "accepted"
		}
		t.row(a.At.UTC().Format(time.RFC3339Nano), a.Writer, tokenText(a.Token), result, tokenText(a.Floor), a.Part)
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(list) == r.opts.limit {
		fmt.Fprintf(r.stderr, "leasefence: attempts: showing the first %d entries; raise --limit or narrow --since\n", r.opts.limit)
	}
	return nil
}

// parseToken parses a TOKEN operand.
func parseToken(cmd, v string) (leasecore.Token, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	switch {
	case err != nil:
		return 0, usagef(cmd, "%s: invalid TOKEN %q: want a decimal number", cmd, v)
	case n == 0:
		return 0, usagef(cmd, "%s: invalid TOKEN %q: must be positive (0 is never issued)", cmd, v)
	case leasecore.Token(n) > backendkit.MaxToken:
		return 0, usagef(cmd, "%s: invalid TOKEN %q: above the largest token %d (%d is reserved: the floor of a sealed scope)",
			cmd, v, backendkit.MaxToken, leasecore.SealedFloor)
	}
	return leasecore.Token(n), nil
}

func runAdvance(ctx context.Context, r *runner, operands []string) error {
	const cmd = "advance"
	if len(operands) != 2 {
		return usagef(cmd, "advance: takes SCOPE and TOKEN, got %d operands", len(operands))
	}
	scope := operands[0]
	if err := checkName(cmd, "SCOPE", scope); err != nil {
		return err
	}
	token, err := parseToken(cmd, operands[1])
	if err != nil {
		return err
	}
	writer := r.operator()
	if err := checkName(cmd, "--writer", writer); err != nil {
		return err
	}
	lease, explicit := scope, r.opts.set["lease"]
	if explicit {
		lease = r.opts.lease
	}
	note := ""
	if !r.opts.force {
		bound, desc, known, err := r.backend.tokenBound(ctx, lease, explicit)
		switch {
		case err != nil:
			return fmt.Errorf("TOKEN %d could not be checked against lease %q's tokens (nothing changed; --force skips the check): %w", token, lease, err)
		case known && token > bound:
			return fmt.Errorf("TOKEN %d is above every token lease %q can have issued (%s): the fence would reject its current holder"+
				" and the next ones; nothing changed (use break to end the current holding period; --force if you mean it)", token, lease, desc)
		case !known:
			note = desc + ": TOKEN not checked"
		}
	}
	before, err := r.backend.floor(ctx, scope)
	if err != nil {
		return err
	}
	res, err := r.backend.advance(ctx, leasecore.Claim{Scope: scope, Writer: writer, Token: token})
	if err != nil {
		return err
	}
	if r.opts.json {
		return writeJSON(r.stdout, struct {
			Backend     string `json:"backend"`
			Scope       string `json:"scope"`
			Token       uint64 `json:"token"`
			Accepted    bool   `json:"accepted"`
			FloorBefore uint64 `json:"floor_before"`
			Floor       uint64 `json:"floor"`
			Note        string `json:"note,omitempty"`
		}{r.backend.kind(), scope, uint64(token), res.Accepted, uint64(before), uint64(res.Floor), note})
	}
	if note != "" {
		fmt.Fprintf(r.stderr, "leasefence: advance: note: %s\n", note)
	}
	switch {
	case !res.Accepted:
		fmt.Fprintf(r.stdout, "scope %s: floor is already %d, above %d: nothing changed (tokens below %d are rejected)\n", scope, res.Floor, token, res.Floor)
	case before == token:
		fmt.Fprintf(r.stdout, "scope %s: floor was already %d: tokens below %d are rejected\n", scope, token, token)
	default:
		fmt.Fprintf(r.stdout, "scope %s: floor %s -> %d: tokens below %d are rejected from now on\n", scope, tokenText(before), token, token)
	}
	return nil
}

func runPrune(ctx context.Context, r *runner, scopes []string) error {
	const cmd = "prune-attempts"
	if !r.opts.set["older-than"] {
		return usagef(cmd, "prune-attempts: --older-than is required (e.g. --older-than 720h)")
	}
	for _, s := range scopes {
		if err := checkName(cmd, "SCOPE", s); err != nil {
			return err
		}
	}
	before := time.Now().Add(-r.opts.olderThan)
	if len(scopes) == 0 {
		all, err := r.backend.floors(ctx, r.backend.maxList())
		if err != nil {
			return err
		}
		if len(all) == r.backend.maxList() {
			return fmt.Errorf("more than %d scopes: name the scopes to prune", len(all))
		}
		for _, f := range all {
			scopes = append(scopes, f.Scope)
		}
	}
	type pruned struct {
		Scope   string `json:"scope"`
		Deleted int64  `json:"deleted"`
	}
	out := struct {
		Backend string    `json:"backend"`
		Before  time.Time `json:"before"`
		Scopes  []pruned  `json:"scopes"`
		Deleted int64     `json:"deleted"`
	}{Backend: r.backend.kind(), Before: before, Scopes: []pruned{}}
	for _, s := range scopes {
		n, err := r.backend.prune(ctx, s, before)
		if err != nil {
			return fmt.Errorf("scope %s (after %d entries of %d scopes deleted): %w", s, out.Deleted, len(out.Scopes), err)
		}
		out.Scopes = append(out.Scopes, pruned{s, n})
		out.Deleted += n
	}
	if r.opts.json {
		return writeJSON(r.stdout, out)
	}
	for _, p := range out.Scopes {
		fmt.Fprintf(r.stdout, "scope %s: %s deleted\n", p.Scope, entries(p.Deleted))
	}
	fmt.Fprintf(r.stdout, "%s logged before %s deleted\n", entries(out.Deleted), before.UTC().Format(time.RFC3339))
	return nil
}

// entries counts attempt-log entries in English.
func entries(n int64) string {
	if n == 1 {
		return "1 entry"
	}
	return fmt.Sprintf("%d entries", n)
}
