package redislock

import (
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrBadTokenRecord means the last-token record of a lock name holds
// something the acquire script cannot increase exactly: not a canonical
// decimal integer, or 2^53 - 1 or more (Lua, which runs the script, counts
// in doubles). fence never writes such a record; a foreign or tampered one
// is refused rather than risk a repeated or negative token. The error names
// the key; delete it, or set it to a valid token, to go on. Acquire wraps it
// in an error matching fence.ErrNotAcquired.
var ErrBadTokenRecord = errors.New("redislock: bad token record")

// scriptError turns the acquire script's refusal into ErrBadTokenRecord and
// leaves other errors as they are.
func scriptError(err error) error {
	if redis.HasErrorPrefix(err, "FENCETOKEN") {
		return fmt.Errorf("%w: %s", ErrBadTokenRecord, err.Error()[len("FENCETOKEN "):])
	}
	return err
}
