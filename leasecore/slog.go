package leasecore

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// WithLogger logs the session's lifecycle to l, as a session observer (see
// WithSessionObserver; it adds to, and does not replace, other observers):
//
//	INFO  "lease acquired"          lease, holder, token, ttl, deadline_in, latency
//	DEBUG "lease held by another holder" (an acquire that found it held: normal
//	                                for every instance but one)
//	WARN  "lease acquire failed"    err
//	DEBUG "lease renewed"           latency, deadline_in
//	WARN  "lease renewed late"      latency, deadline_in (see SessionEvent.Late)
//	WARN  "lease renewal failed"    err, deadline_in
//	WARN  "lease lost"              reason ("lost": the hold is over, expired or taken
//	                                over; "local deadline": no renewal succeeded in
//	                                time), err
//	INFO  "lease released"          (Close; WARN with err when the release failed)
//
// Every record has lease, holder and token. Nothing is logged without a
// logger: a nil l is ignored. Records are written with
// context.Background(): observers run on the session's goroutines, not the
// caller's.
func WithLogger(l *slog.Logger) SessionOption {
	if l == nil {
		return WithSessionObserver(nil)
	}
	return WithSessionObserver(func(ev SessionEvent) { logSessionEvent(l, ev) })
}

func logSessionEvent(l *slog.Logger, ev SessionEvent) {
	ctx := context.Background()
	g := ev.Grant
	attrs := []slog.Attr{slog.String("lease", g.Name), slog.String("holder", g.Holder)}
	if g.Token != 0 {
		attrs = append(attrs, slog.Uint64("token", uint64(g.Token)))
	}
	left := func() slog.Attr { return slog.Duration("deadline_in", time.Until(ev.Deadline)) }
	level, msg := slog.LevelInfo, ""
	switch ev.Kind {
	case SessionAcquired:
		msg = "lease acquired"
		attrs = append(attrs, slog.Duration("ttl", g.TTL), left(), slog.Duration("latency", ev.Latency))
	case SessionAcquireFailed:
		if errors.Is(ev.Err, ErrHeld) {
			level, msg = slog.LevelDebug, "lease held by another holder"
		} else {
			level, msg = slog.LevelWarn, "lease acquire failed"
		}
		attrs = append(attrs, slog.Any("err", ev.Err))
	case SessionRenewed:
		level, msg = slog.LevelDebug, "lease renewed"
		if ev.Late {
			level, msg = slog.LevelWarn, "lease renewed late"
		}
		attrs = append(attrs, slog.Duration("latency", ev.Latency), left())
	case SessionRenewFailed:
		level, msg = slog.LevelWarn, "lease renewal failed"
		attrs = append(attrs, slog.Any("err", ev.Err), left())
	case SessionEnded:
		switch reason := endReason(ev.Err); reason {
		case "closed":
			msg = "lease released"
			if ev.Err != ErrClosed { // Close's release failed (see closedErr)
				level = slog.LevelWarn
				attrs = append(attrs, slog.Any("err", ev.Err))
			}
		default:
			level, msg = slog.LevelWarn, "lease lost"
			attrs = append(attrs, slog.String("reason", reason), slog.Any("err", ev.Err))
		}
	default:
		msg = "lease " + ev.Kind.String()
	}
	if l.Enabled(ctx, level) {
		l.LogAttrs(ctx, level, msg, attrs...)
	}
}

// endReason names why a session ended, from its error: "lost" (ErrLost),
// "local deadline" (ErrLocalDeadline), "closed" (ErrClosed), or "" for
// anything else.
func endReason(err error) string {
	switch {
	case errors.Is(err, ErrLost):
		return "lost"
	case errors.Is(err, ErrLocalDeadline):
		return "local deadline"
	case errors.Is(err, ErrClosed):
		return "closed"
	}
	return ""
}
