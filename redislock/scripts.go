package redislock

import (
	_ "embed"
	"strings"

	"github.com/fencekit/fence/internal/redisconn"
	"github.com/redis/go-redis/v9"
)

// The scripts run by SHA (EVALSHA) and fall back to EVAL on NOSCRIPT, as
// redis.Script does, so a server that lost its script cache still works;
// state.lua is always sent in full (see redisconn.Script's Full).
var (
	// tokenSrc and grantSrc are the Lua that acquire.lua and release.lua
	// share: the token arithmetic and the queue of waiters. Each script is
	// its body with both at its marker line (see withGrant).
	//go:embed token.lua
	tokenSrc string
	//go:embed grant.lua
	grantSrc string

	//go:embed acquire.lua
	acquireBody   string
	acquireSrc    = withGrant(acquireBody, tokenSrc+grantSrc)
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)

	//go:embed release.lua
	releaseBody   string
	releaseSrc    = withGrant(releaseBody, tokenSrc+grantSrc)
	releaseScript = redis.NewScript(releaseSrc)

	//go:embed keep.lua
	keepSrc    string
	keepScript = redis.NewScript(keepSrc)

	//go:embed replicas.lua
	replicasSrc    string
	replicasScript = redis.NewScript(replicasSrc)
	// replicasReadScript is replicas.lua declared free of writes, for its
	// "read" mode (Status, ReplicaCounts), which writes nothing: Redis
	// holds back a script without that flag for as long as writes are
	// paused (CLIENT PAUSE WRITE, a switchover), when an operator reads
	// the counts (TestFirstStatusDuringWritePause).
	replicasReadSrc    = "#!lua flags=no-writes\n" + replicasSrc
	replicasReadScript = redis.NewScript(replicasReadSrc)

	//go:embed state.lua
	stateSrc    string
	stateScript = redis.NewScript(stateSrc)
)

// grantMarker is the line of acquire.lua and release.lua where the Lua they
// share goes: after their common paths (a free lock nobody queues for, a
// release nobody waits for), which then return before any closure is
// made; making them is about a tenth of either script's run on that path.
const grantMarker = "-- grant.lua --\n"

// withGrant returns body with src in place of its marker line.
func withGrant(body, src string) string {
	if strings.Count(body, grantMarker) != 1 {
		panic("redislock: a script without one " + strings.TrimSpace(grantMarker) + " line")
	}
	return strings.Replace(body, grantMarker, src, 1)
}

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
	keepScript:     {Src: keepSrc, SHA: keepScript.Hash()},
	replicasScript: {Src: replicasSrc, SHA: replicasScript.Hash()},
	// Sent in full, as state.lua.
	replicasReadScript: {Src: replicasReadSrc, SHA: replicasReadScript.Hash(), Full: true},
	stateScript:        {Src: stateSrc, SHA: stateScript.Hash(), Full: true}, // see state.lua
}
