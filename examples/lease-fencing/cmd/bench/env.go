package main

import (
	"context"
	"errors"
	"fmt"
)

// env is every server the bench measures against.
type env struct {
	pg   *pgEnv
	etcd *etcdEnv
}

func startEnv(ctx context.Context, say func(string, ...any)) (_ *env, err error) {
	e := &env{}
	if e.pg, err = startPG(ctx, say); err != nil {
		return nil, err
	}
	if e.etcd, err = startEtcd(ctx, say); err != nil {
		return nil, errors.Join(err, e.close())
	}
	return e, nil
}

func (e *env) close() error {
	var err error
	if e.etcd != nil {
		err = errors.Join(err, e.etcd.close())
	}
	if e.pg != nil {
		err = errors.Join(err, e.pg.close())
	}
	return err
}

func (e *env) describe() string {
	return fmt.Sprintf("PostgreSQL %s via pgx/v5, etcd %s, both on loopback", e.pg.cluster.Version(), e.etcd.srv.Version())
}

func (e *env) variants(ctx context.Context) ([]variant, error) {
	pg, err := e.pg.pgVariants(ctx)
	if err != nil {
		return nil, err
	}
	etcd, err := e.etcd.etcdVariants(ctx)
	if err != nil {
		return nil, err
	}
	return append(pg, etcd...), nil
}

func (e *env) scaling(ctx context.Context, sizes string, say func(string, ...any)) (scaleResult, error) {
	ns, err := parseSizes(sizes)
	if err != nil {
		return scaleResult{}, err
	}
	return e.pg.pgScaling(ctx, ns, say)
}
