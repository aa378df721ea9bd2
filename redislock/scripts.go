package redislock

import (
	_ "embed"

	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

// The scripts run by SHA (EVALSHA) and fall back to EVAL on NOSCRIPT, as
// redis.Script does, so a server that lost its script cache still works.
var (
	// grantSrc is the Lua that acquire.lua and release.lua share: the
	// token arithmetic and the queue of waiters, put in front of each.
	//go:embed grant.lua
	grantSrc string

	//go:embed acquire.lua
	acquireBody   string
	acquireSrc    = grantSrc + acquireBody
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)

	//go:embed release.lua
	releaseBody   string
	releaseSrc    = grantSrc + releaseBody
	releaseScript = redis.NewScript(releaseSrc)

	//go:embed replicas.lua
	replicasSrc    string
	replicasScript = redis.NewScript(replicasSrc)
)

// skeys are a script's keys, and (when not nil) the same boxed for a
// command's arguments, in the same order. Keys boxed once per lock name
// spare the boxing of each key of each call (see scriptCmd).
type skeys struct {
	names []string
	boxed []any
}

// connScripts are the scripts as a redisconn.Conn runs them.
var connScripts = map[*redis.Script]*redisconn.Script{
	acquireScript:  {Src: acquireSrc, SHA: acquireScript.Hash()},
	extendScript:   {Src: extendSrc, SHA: extendScript.Hash()},
	releaseScript:  {Src: releaseSrc, SHA: releaseScript.Hash()},
	replicasScript: {Src: replicasSrc, SHA: replicasScript.Hash()},
}
