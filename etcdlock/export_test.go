package etcdlock

import clientv3 "go.etcd.io/etcd/client/v3"

// SpareIDs returns the etcd leases l keeps for reuse, oldest first.
func (l *Locker) SpareIDs() []clientv3.LeaseID {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]clientv3.LeaseID, len(l.spares))
	for i, sp := range l.spares {
		ids[i] = sp.id
	}
	return ids
}

// Raw reports whether the Locker sends its create Txn and delete as gRPC
// requests of its own (see rawKV).
func (l *Locker) Raw() bool { return l.kv != nil }
