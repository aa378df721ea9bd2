package redislock

import (
	"context"
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

// skeys are a script's keys, and the same boxed for a command's arguments
// (nil: box them for each call). Keys boxed once per lock name spare
// go-redis's boxing of each key of each call.
type skeys struct {
	names []string
	boxed []any
}

// boxedScripts are each script's SHA and source, boxed once.
var boxedScripts = map[*redis.Script][2]any{
	acquireScript:  {acquireScript.Hash(), acquireSrc},
	extendScript:   {extendScript.Hash(), extendSrc},
	releaseScript:  {releaseScript.Hash(), releaseSrc},
	replicasScript: {replicasScript.Hash(), replicasSrc},
}

// evalArgs are the arguments of EVALSHA (EVAL when load) of script on
// keys and args.
func evalArgs(script *redis.Script, load bool, keys, args []any) []any {
	s := boxedScripts[script]
	a := make([]any, 0, 3+len(keys)+len(args))
	if load {
		a = append(a, "eval", s[1])
	} else {
		a = append(a, "evalsha", s[0])
	}
	a = append(a, len(keys))
	a = append(a, keys...)
	return append(a, args...)
}

// runScript runs script on c by SHA, and again in full on NOSCRIPT, as
// redis.Script.Run does.
func runScript(ctx context.Context, c redis.Cmdable, script *redis.Script, keys skeys, args []any) *redis.Cmd {
	d, ok := c.(interface {
		Do(context.Context, ...any) *redis.Cmd
	})
	if keys.boxed == nil || !ok {
		return script.Run(ctx, c, keys.names, args...)
	}
	reply := d.Do(ctx, evalArgs(script, false, keys.boxed, args)...)
	if redis.HasErrorPrefix(reply.Err(), "NOSCRIPT") {
		reply = d.Do(ctx, evalArgs(script, true, keys.boxed, args)...)
	}
	return reply
}

// connScripts are the scripts as a redisconn.Conn runs them.
var connScripts = map[*redis.Script]*redisconn.Script{
	acquireScript:  {Src: acquireSrc, SHA: acquireScript.Hash()},
	extendScript:   {Src: extendSrc, SHA: extendScript.Hash()},
	releaseScript:  {Src: releaseSrc, SHA: releaseScript.Hash()},
	replicasScript: {Src: replicasSrc, SHA: replicasScript.Hash()},
}
