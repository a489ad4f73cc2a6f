package etcdcontrol_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdcontrol"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/tests/internal/etcdtest"
	"github.com/leasefence/leasefence/leasecore"
)

func TestMain(m *testing.M) {
	if etcdtemp.IsServeProcess() {
		os.Exit(etcdtemp.Serve())
	}
	etcdtest.Main(m)
}

// newControls returns controls and the fenced resource on a fresh prefix;
// the resource logs every attempt, as the controls do.
func newControls(t *testing.T) (*etcdcontrol.Controls, *fenceetcd.Resource) {
	t.Helper()
	cli := etcdtest.Client(t)
	opt := fenceetcd.WithPrefix(etcdtest.Prefix())
	c, err := etcdcontrol.New(cli, opt)
	if err != nil {
		t.Fatal(err)
	}
	res, err := fenceetcd.NewResource(cli, opt, fenceetcd.WithAttemptLog(leasecore.LogAll))
	if err != nil {
		t.Fatal(err)
	}
	return c, res
}

type step struct {
	part, content, writer string
	token                 leasecore.Token
	accepted              bool
	floor                 leasecore.Token
}

// play writes each step to r and checks its result.
func play(t *testing.T, r leasecore.FencedResource, scope string, steps ...step) {
	t.Helper()
	for _, s := range steps {
		res, err := r.Write(context.Background(), leasecore.Write{
			Scope: scope, Part: s.part, Content: s.content, Writer: s.writer, Token: s.token})
		if err != nil {
			t.Fatal(err)
		}
		if res.Accepted != s.accepted || res.Floor != s.floor {
			t.Fatalf("%s token %d on %s: got %+v, want accepted=%v floor=%d", s.writer, s.token, s.part, res, s.accepted, s.floor)
		}
	}
}

// state renders a part, the floor and the write log.
func state(t *testing.T, r *etcdcontrol.Resource, scope, part string) string {
	t.Helper()
	ctx := context.Background()
	p, ok, err := r.ReadPart(ctx, scope, part)
	if err != nil {
		t.Fatal(err)
	}
	floor, err := r.Floor(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	as, err := r.Attempts(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	for _, a := range as {
		log = append(log, fmt.Sprintf("%s/%s/%d/%v/%d", a.Part, a.Writer, a.Token, a.Accepted, a.Floor))
	}
	desc := "(none)"
	if ok {
		desc = fmt.Sprintf("%s by %s token=%d", p.Content, p.Writer, p.Token)
	}
	return fmt.Sprintf("%s; floor=%d; log=%s", desc, floor, strings.Join(log, " "))
}

// TestUnfenced: a stale token overwrites a newer one's data; the floor the
// fenced resource set is reported but never consulted.
func TestUnfenced(t *testing.T) {
	c, fenced := newControls(t)
	u := c.Unfenced()
	const scope = "daily-report"
	play(t, fenced, scope, step{"detail", "d(B)", "holder-b", 2, true, 2})
	play(t, u, scope,
		step{"summary", "new(B)", "holder-b", 2, true, 2},
		step{"summary", "old(A)", "holder-a", 1, true, 2})
	want := "old(A) by holder-a token=1; floor=2; log=detail/holder-b/2/true/2 summary/holder-b/2/true/2 summary/holder-a/1/true/2"
	if got := state(t, u, scope, "summary"); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestCheckThenWrite: without a pause it behaves; with the F6a
// interleaving the stale writer's decision is acted on after the newer
// write and moves the floor BACK.
func TestCheckThenWrite(t *testing.T) {
	c, _ := newControls(t)
	plain := c.CheckThenWrite(nil)
	play(t, plain, "calm",
		step{"summary", "a", "holder-a", 1, true, 1},
		step{"summary", "b", "holder-b", 2, true, 2},
		step{"summary", "a2", "holder-a", 1, false, 2})
	if got, want := state(t, plain, "calm", "summary"),
		"b by holder-b token=2; floor=2; log=summary/holder-a/1/true/1 summary/holder-b/2/true/2 summary/holder-a/1/false/2"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}

	paused, release := make(chan struct{}), make(chan struct{})
	racy := c.CheckThenWrite(func(ctx context.Context, w leasecore.Write) error {
		if w.Writer == "holder-a" {
			close(paused)
			<-release
		}
		return nil
	})
	done := make(chan error, 1)
	go func() {
		res, err := racy.Write(context.Background(), leasecore.Write{Scope: "race", Part: "summary", Content: "old(A)", Writer: "holder-a", Token: 1})
		if err == nil && !res.Accepted {
			err = fmt.Errorf("A rejected: %+v", res)
		}
		done <- err
	}()
	<-paused // A read floor 0 and decided to write
	play(t, racy, "race", step{"summary", "new(B)", "holder-b", 2, true, 2})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := state(t, racy, "race", "summary"),
		"old(A) by holder-a token=1; floor=1; log=summary/holder-b/2/true/2 summary/holder-a/1/true/1"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestRowFenced: the part's own token rejects a stale write to that part,
// but a part nobody wrote has nothing to compare with (F7).
func TestRowFenced(t *testing.T) {
	c, _ := newControls(t)
	r := c.RowFenced()
	const scope = "daily-report"
	play(t, r, scope,
		step{"summary", "rows=100(A)", "holder-a", 1, true, 0},
		step{"summary", "rows=101(B)", "holder-b", 2, true, 0},
		step{"summary", "rows=100(A)", "holder-a", 1, false, 0},
		step{"summary", "rows=102(B)", "holder-b", 2, true, 0},
		step{"detail", "detail(A)", "holder-a", 1, true, 0})
	if got, want := state(t, r, scope, "detail"),
		"detail(A) by holder-a token=1; floor=0; log=summary/holder-a/1/true/0 summary/holder-b/2/true/0 "+
			"summary/holder-a/1/false/0 summary/holder-b/2/true/0 detail/holder-a/1/true/0"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestIdempotentPublisher: the first publication of a key wins, whatever
// the tokens; ReadPart reads the publication, not the part.
func TestIdempotentPublisher(t *testing.T) {
	c, fenced := newControls(t)
	p := c.IdempotentPublisher()
	const scope = "daily-report"
	play(t, p, scope,
		step{"report", "report(A-stale)", "holder-a", 1, true, 0},
		step{"report", "report(B)", "holder-b", 2, false, 0})
	if got, want := state(t, p, scope, "report"),
		"report(A-stale) by holder-a token=1; floor=0; log=report/holder-a/1/true/0 report/holder-b/2/false/0"; got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if _, ok, err := fenced.ReadPart(context.Background(), scope, "report"); err != nil || ok {
		t.Fatalf("the publication is in the part keys: ok=%v, %v", ok, err)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := etcdcontrol.New(nil); err == nil || !strings.Contains(err.Error(), "client") {
		t.Fatalf("New(nil): %v", err)
	}
	if _, err := etcdcontrol.New(etcdtest.Client(t), fenceetcd.WithPrefix("no-slash")); err == nil || !strings.Contains(err.Error(), "prefix") {
		t.Fatalf("New with a bad prefix: %v", err)
	}
}
