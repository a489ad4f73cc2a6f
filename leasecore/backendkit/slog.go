package backendkit

import (
	"context"
	"errors"
	"log/slog"

	"github.com/leasefence/leasefence/leasecore"
)

// FenceLogger returns a fence observer (for fencepg's and fenceetcd's
// WithFenceObserver; their WithLogger options use it) that logs to l:
//
//	WARN  "stale write rejected"    op, scope, writer, token, floor (and err when
//	                                logging the rejection failed)
//	ERROR "write rejected: token from another lease service"
//	                                op, scope, writer, token, space, floor, err
//	                                (leasecore.ErrTokenSpace: a deployment mistake,
//	                                see there)
//	DEBUG "fenced write accepted"   op, scope, writer, token
//
// A nil l returns nil, which the WithFenceObserver options ignore.
func FenceLogger(l *slog.Logger) func(leasecore.FenceEvent) {
	if l == nil {
		return nil
	}
	return func(ev leasecore.FenceEvent) {
		ctx := context.Background()
		c := ev.Claim
		level, msg := slog.LevelDebug, "fenced write accepted"
		if !ev.Result.Accepted {
			level, msg = slog.LevelWarn, "stale write rejected"
			if errors.Is(ev.Err, leasecore.ErrTokenSpace) {
				level, msg = slog.LevelError, "write rejected: token from another lease service"
			}
		}
		if !l.Enabled(ctx, level) {
			return // the accepted path stays cheap at the usual levels
		}
		attrs := []slog.Attr{slog.String("op", ev.Op), slog.String("scope", c.Scope),
			slog.String("writer", c.Writer), slog.Uint64("token", uint64(c.Token))}
		if !ev.Result.Accepted {
			if c.Space != "" {
				attrs = append(attrs, slog.String("space", c.Space))
			}
			attrs = append(attrs, slog.Uint64("floor", uint64(ev.Result.Floor)))
			if ev.Err != nil {
				attrs = append(attrs, slog.Any("err", ev.Err))
			}
		}
		l.LogAttrs(ctx, level, msg, attrs...)
	}
}
