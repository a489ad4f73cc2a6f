package main

import (
	"context"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	fenceetcd "github.com/leasefence/leasefence/fence-etcd"
)

// BenchmarkClientCost measures the client's own CPU of an acquire+release
// pair without a server: the requests go through clientv3's KV to a KV
// client of the benchmark's own, which marshals each request and answers
// with a marshalled response, as the wire would. It runs
// etcd_acquire_release's pair and the same requests as the raw Txns of
// probe_limit_holder_gens, so their difference is fence-etcd's own code.
//
//	go test -run '^$' -bench BenchmarkClientCost -benchmem ./cmd/bench/
func BenchmarkClientCost(b *testing.B) {
	ctx := context.Background()
	kvc := &fakeKV{}
	cli := clientv3.NewCtxClient(ctx)
	cli.KV = clientv3.NewKVFromKVClient(kvc, nil)
	cli.Lease = fakeLease{}
	b.Run("fenced", func(b *testing.B) {
		leases, err := fenceetcd.NewLeaseStore(cli, fenceetcd.WithPrefix("/bench/leases"), fenceetcd.WithSharedLeases())
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			g, err := leases.Acquire(ctx, "daily-report", "holder-a", 60*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if err := leases.Release(ctx, g); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw", func(b *testing.B) {
		const key, holder = "/bench/leases/lease/daily-report", "holder-a"
		b.ReportAllocs()
		for b.Loop() {
			r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, holder, clientv3.WithLease(7))).Commit()
			if err != nil || !r.Succeeded {
				b.Fatal(err)
			}
			d, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", r.Header.Revision),
				clientv3.Compare(clientv3.Value(key), "=", holder)).
				Then(clientv3.OpDelete(key), clientv3.OpDelete("/bench/leases/holdergen/holder-a/", clientv3.WithPrefix())).Commit()
			if err != nil || !d.Succeeded {
				b.Fatal(err)
			}
		}
	})
}

// fakeKV answers every Txn as succeeded, with one result per operation of
// the Then branch, each request and response marshalled and the response
// unmarshalled again.
type fakeKV struct {
	pb.KVClient
	rev int64
}

func (f *fakeKV) Txn(_ context.Context, in *pb.TxnRequest, _ ...grpc.CallOption) (*pb.TxnResponse, error) {
	if _, err := proto.Marshal(in); err != nil {
		return nil, err
	}
	f.rev++
	resp := &pb.TxnResponse{Header: &pb.ResponseHeader{ClusterId: 0x8e9e05c52164694d, MemberId: 1, Revision: f.rev, RaftTerm: 2},
		Succeeded: true}
	for _, op := range in.Success {
		switch op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{
				ResponsePut: &pb.PutResponse{Header: &pb.ResponseHeader{}}}})
		case *pb.RequestOp_RequestDeleteRange:
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{
				ResponseDeleteRange: &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{}, Deleted: 1}}})
		default:
			resp.Responses = append(resp.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{
				ResponseRange: &pb.RangeResponse{Header: &pb.ResponseHeader{}}}})
		}
	}
	wire, err := proto.Marshal(resp)
	if err != nil {
		return nil, err
	}
	out := &pb.TxnResponse{}
	return out, proto.Unmarshal(wire, out)
}

// fakeLease grants lease 7 and nothing else.
type fakeLease struct{ clientv3.Lease }

func (fakeLease) Grant(context.Context, int64) (*clientv3.LeaseGrantResponse, error) {
	return &clientv3.LeaseGrantResponse{ID: 7, TTL: 60, ResponseHeader: &pb.ResponseHeader{}}, nil
}
