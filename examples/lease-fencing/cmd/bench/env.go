package main

import (
	"context"
	"errors"
	"fmt"
)

// env is every server the bench measures against.
type env struct {
	pg *pgEnv
}

func startEnv(ctx context.Context, say func(string, ...any)) (*env, error) {
	pg, err := startPG(ctx, say)
	if err != nil {
		return nil, err
	}
	return &env{pg: pg}, nil
}

func (e *env) close() error {
	var err error
	if e.pg != nil {
		err = errors.Join(err, e.pg.close())
	}
	return err
}

func (e *env) describe() string {
	return fmt.Sprintf("PostgreSQL %s via pgx/v5 on loopback", e.pg.cluster.Version())
}

func (e *env) variants(ctx context.Context) ([]variant, error) {
	return e.pg.pgVariants(ctx)
}

func (e *env) scaling(ctx context.Context, sizes string, say func(string, ...any)) (scaleResult, error) {
	ns, err := parseSizes(sizes)
	if err != nil {
		return scaleResult{}, err
	}
	return e.pg.pgScaling(ctx, ns, say)
}
