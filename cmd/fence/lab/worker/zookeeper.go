package worker

import (
	"fmt"
	"strings"
	"time"

	"github.com/fencekit/fence"
	"github.com/fencekit/fence/zklock"
	"github.com/go-zookeeper/zk"
)

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// zookeeperLocker connects to s.ZooKeeper and returns zklock's Locker and
// the func that closes the connection.
func zookeeperLocker(s Spec) (fence.Locker, func(), error) {
	st := zklock.NewSessionTimeouts(quietLogger{}) // the granted session timeouts, for the leases' deadlines
	conn, _, err := zk.Connect(strings.Split(s.ZooKeeper, ","), s.SessionTimeout, zk.WithLogger(st))
	if err != nil {
		return nil, nil, err
	}
	end := time.Now().Add(10 * time.Second)
	for conn.State() != zk.StateHasSession {
		if time.Now().After(end) {
			conn.Close()
			return nil, nil, fmt.Errorf("zookeeper %s: no session after 10 s", s.ZooKeeper)
		}
		time.Sleep(10 * time.Millisecond)
	}
	l, err := zklock.New(conn, s.SessionTimeout, zklock.WithSessionTimeouts(st))
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return l, conn.Close, nil
}
