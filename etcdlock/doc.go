// Package etcdlock is a fence.Locker on etcd.
package etcdlock
