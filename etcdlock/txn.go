package etcdlock

import (
	"context"
	"math"
	"reflect"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// rawKV returns the gRPC KV client under client.KV when client.KV is
// clientv3's own, over the client's connection, and nil otherwise (a
// namespace.NewKV, an ordering KV, an in-process v3client: the create Txn
// and Release's delete then go through client.KV, whose keys those may
// rewrite). The create Txn and the delete, built as requests, cost some 60
// allocations less per acquire+release than through clientv3's builders,
// and some 4% of its latency (BenchmarkInterleaved).
//
// clientv3's own type may also sit on a gRPC KV client of the user's
// (clientv3.NewKVFromKVClient: tracing, a proxy's adapter, a rewrite of
// keys): its unexported field remote, read by reflection (its type only),
// must be the one NewKV puts there; if clientv3 renames it, the requests
// go through client.KV, slower but right.
func rawKV(client *clientv3.Client) pb.KVClient {
	if client.ActiveConnection() == nil || client.KV == nil {
		return nil
	}
	own := clientv3.NewKV(client)
	if reflect.TypeOf(client.KV) != reflect.TypeOf(own) || remoteType(client.KV) != remoteType(own) || remoteType(own) == nil {
		return nil
	}
	return clientv3.RetryKVClient(client)
}

// remoteType is the dynamic type of kv's field remote, if kv is a pointer
// to a struct with such an interface field; nil otherwise.
func remoteType(kv clientv3.KV) reflect.Type {
	v := reflect.ValueOf(kv)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	f := v.Elem().FieldByName("remote")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return nil
	}
	return f.Elem().Type()
}

// raw returns the gRPC KV client for the create Txn and the delete, or nil
// if they must go through client.KV: always, when client.KV was not
// clientv3's own at New; and since, if the user has wrapped it (etcd's
// namespace package) after New, when every other call (the waiter's Txn,
// Extend's, the watch, the user's IsOwner) goes through the wrapper. The
// comparison costs no allocation.
func (l *Locker) raw() pb.KVClient {
	if l.kv == nil || l.client.KV != l.ownKV {
		return nil
	}
	return l.kv
}

// rawCallOpts are clientv3's default call options: wait for a connection
// rather than fail at once, and no bound on the reply (the create Txn reads
// three keys at most).
var rawCallOpts = []grpc.CallOption{grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(math.MaxInt32)}

// createTxn is the create Txn's request in one allocation: clientv3's Txn
// builder (Compare, OpPut, OpGet and their options, Then, Else, If) makes
// some 45 of them for it, as many as the gRPC call itself.
type createTxn struct {
	req    pb.TxnRequest
	cmp    pb.Compare
	cmpRev pb.Compare_CreateRevision
	cmps   [1]*pb.Compare
	ops    [4]pb.RequestOp
	then   [2]*pb.RequestOp
	els    [2]*pb.RequestOp
	put    pb.RequestOp_RequestPut
	putReq pb.PutRequest
	rng    [3]pb.RequestOp_RequestRange
	rngReq [3]pb.RangeRequest
}

// newCreateTxn builds the request that create sends through clientv3's
// Txn builder (see there): if the key was never created, put it on the
// etcd lease id and read the two newest keys under pfx; else read the key
// and the oldest key under pfx.
func newCreateTxn(pfx, key string, id clientv3.LeaseID) *pb.TxnRequest {
	t := new(createTxn)
	// One buffer for the key, the prefix and the prefix's range end.
	buf := make([]byte, 0, len(key)+2*len(pfx))
	buf = append(buf, key...)
	k := buf[:len(key):len(key)]
	buf = append(buf, pfx...)
	p := buf[len(key):len(buf):len(buf)]
	buf = append(buf, pfx...)
	end := buf[len(key)+len(pfx):]
	end = prefixEnd(end)

	t.cmp.Key, t.cmp.Target, t.cmp.Result = k, pb.Compare_CREATE, pb.Compare_EQUAL
	t.cmp.TargetUnion = &t.cmpRev // CreateRevision 0
	t.cmps[0] = &t.cmp

	t.putReq.Key, t.putReq.Lease = k, int64(id)
	t.put.RequestPut = &t.putReq
	t.ops[0].Request = &t.put

	// Then: the two newest keys under pfx.
	t.rngReq[0] = pb.RangeRequest{Key: p, RangeEnd: end, Limit: 2, SortOrder: pb.RangeRequest_DESCEND, SortTarget: pb.RangeRequest_CREATE}
	// Else: the key, and the oldest key under pfx.
	t.rngReq[1] = pb.RangeRequest{Key: k}
	t.rngReq[2] = pb.RangeRequest{Key: p, RangeEnd: end, Limit: 1, SortOrder: pb.RangeRequest_ASCEND, SortTarget: pb.RangeRequest_CREATE}
	for i := range t.rng {
		t.rng[i].RequestRange = &t.rngReq[i]
		t.ops[i+1].Request = &t.rng[i]
	}
	t.then = [2]*pb.RequestOp{&t.ops[0], &t.ops[1]}
	t.els = [2]*pb.RequestOp{&t.ops[2], &t.ops[3]}
	t.req.Compare, t.req.Success, t.req.Failure = t.cmps[:], t.then[:], t.els[:]
	return &t.req
}

// prefixEnd turns b, a copy of a prefix, into the end of its range, as
// clientv3.WithPrefix does.
func prefixEnd(b []byte) []byte {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return b[:i+1]
		}
	}
	return []byte{0} // every key from the prefix on
}

// txnRaw sends req through kv, converting the error as clientv3 does.
func txnRaw(ctx context.Context, kv pb.KVClient, req *pb.TxnRequest) (*clientv3.TxnResponse, error) {
	resp, err := kv.Txn(ctx, req, rawCallOpts...)
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.TxnResponse)(resp), nil
}

// deleteRaw sends req through kv, converting the error as clientv3 does.
func deleteRaw(ctx context.Context, kv pb.KVClient, req *pb.DeleteRangeRequest) (*clientv3.DeleteResponse, error) {
	resp, err := kv.DeleteRange(ctx, req, rawCallOpts...)
	if err != nil {
		return nil, clientv3.ContextError(ctx, err)
	}
	return (*clientv3.DeleteResponse)(resp), nil
}
