package redlock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The scripts run by SHA (EVALSHA) and fall back to EVAL on NOSCRIPT, as
// redis.Script does, so a node that lost its script cache still works.
var (
	//go:embed acquire.lua
	acquireSrc    string
	acquireScript = redis.NewScript(acquireSrc)

	//go:embed max.lua
	maxSrc    string
	maxScript = redis.NewScript(maxSrc)

	//go:embed extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)

	//go:embed release.lua
	releaseSrc    string
	releaseScript = redis.NewScript(releaseSrc)

	// stateSrc is sent in full (EVAL), never by SHA: a primary that
	// pauses writes holds back the EVALSHA of a script it has not cached,
	// whose no-writes flag it cannot read, for the whole pause.
	//go:embed state.lua
	stateSrc string
)
