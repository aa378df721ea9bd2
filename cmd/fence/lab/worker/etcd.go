package worker

import (
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdLocker connects to s.Etcd and returns etcdlock's Locker and the func
// that closes the client.
func etcdLocker(s Spec) (fence.Locker, func(), error) {
	ec, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(s.Etcd, ","), DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, err
	}
	l, err := etcdlock.New(ec, nil)
	if err != nil {
		_ = ec.Close()
		return nil, nil, err
	}
	return l, func() { _ = ec.Close() }, nil
}
