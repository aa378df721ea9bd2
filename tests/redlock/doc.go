// Package redlock holds the tests of fence/redlock that need a dependency
// the root module must not take: a slow node, made with an in-process
// toxiproxy in front of a real redis-server.
package redlock
