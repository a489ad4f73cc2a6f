package fenceetcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
	"github.com/leasefence/leasefence/fence-etcd/etcdtemp"
	"github.com/leasefence/leasefence/fence-etcd/internal/etcdkv"
	"github.com/leasefence/leasefence/leasecore"
)

// TestAuthErrors: on an etcd with authentication on, a client without a
// user, a wrong password and a user whose roles may not touch the store's
// keys each get an error wrapping leasecore.ErrConfig that says what to
// change, and a campaign returns it instead of retrying. A server of its
// own: authentication would lock every other test out of the shared one.
func TestAuthErrors(t *testing.T) {
	srv := etcdtemp.StartTB(t)
	ctx := context.Background()
	dial := func(t *testing.T, user, password string) (*clientv3.Client, error) {
		t.Helper()
		cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), Username: user, Password: password,
			Logger: zap.NewNop(), DialTimeout: 10 * time.Second})
		if err == nil {
			t.Cleanup(func() { _ = cli.Close() })
		}
		return cli, err
	}
	root, err := dial(t, "", "")
	if err != nil {
		t.Fatal(err)
	}
	// etcdctl user add root; role add root; user grant-role root root;
	// role add app; role grant-permission app readwrite --prefix=true /other/;
	// user add app; user grant-role app app; auth enable.
	for _, step := range []func() error{
		func() error { _, err := root.RoleAdd(ctx, "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "app"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "app", "/other/", clientv3.GetPrefixRangeEnd("/other/"),
				clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "app", "app-password"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "app", "app"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}

	acquire := func(t *testing.T, cli *clientv3.Client) error {
		t.Helper()
		leases, err := fenceetcd.NewLeaseStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leases.Acquire(ctx, "report-job", "holder-a", time.Minute)
		return err
	}
	want := func(t *testing.T, err error, words ...string) {
		t.Helper()
		if !errors.Is(err, leasecore.ErrConfig) || errors.Is(err, leasecore.ErrUnavailable) {
			t.Fatalf("got %v, want an error wrapping ErrConfig (and not ErrUnavailable)", err)
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("message %q lacks %q", err, w)
			}
		}
		t.Log(err)
	}

	t.Run("no user", func(t *testing.T) {
		cli, err := dial(t, "", "")
		if err != nil {
			t.Fatal(err)
		}
		want(t, acquire(t, cli), "fenceetcd: acquire: ", "user name is empty", "set Username and Password")
	})
	t.Run("wrong password", func(t *testing.T) {
		cli, err := dial(t, "app", "wrong")
		if err != nil {
			// The client authenticates while it connects: the error comes
			// from clientv3.New, before any store exists, and maps the same.
			want(t, etcdkv.MapError(ctx, "fenceetcd", "dial", err), "authentication failed", "check Username and Password")
			return
		}
		want(t, acquire(t, cli), "fenceetcd: acquire: ", "authentication failed", "check Username and Password")
	})
	t.Run("permission denied", func(t *testing.T) {
		cli, err := dial(t, "app", "app-password")
		if err != nil {
			t.Fatal(err)
		}
		want(t, acquire(t, cli), "fenceetcd: acquire: ", "permission denied", "etcdctl role grant-permission")
		leases, err := fenceetcd.NewLeaseStore(cli)
		if err != nil {
			t.Fatal(err)
		}
		retried := false
		err = leasecore.Campaign(ctx, leases, "report-job", "holder-a",
			func(context.Context, leasecore.Grant) error { return nil },
			leasecore.WithCampaignObserver(func(ev leasecore.CampaignEvent) {
				retried = retried || ev.Kind == leasecore.CampaignRetry
			}))
		want(t, err, "permission denied")
		if retried {
			t.Error("the campaign retried a configuration error")
		}
		// The same user may use a store whose prefix its role covers.
		ok, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix("/other"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ok.Acquire(ctx, "report-job", "holder-a", time.Minute); err != nil {
			t.Fatalf("acquire under the granted prefix: %v", err)
		}
	})
}
