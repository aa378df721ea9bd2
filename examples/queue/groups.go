package queue

import (
	"context"
	"slices"

	"github.com/fencekit/fence/internal/bound"
	"github.com/redis/go-redis/v9"
)

// noticeGroups logs at ERROR (LogOtherGroups), once per Consumer, that the
// stream has consumer groups other than c's. This package's tables are
// keyed by stream and message id, not by group: a second group (a second
// -group by mistake, or a group renamed while the old one still runs) does
// not apply a message twice, but its leader fences the same guard
// resources with another lock's tokens, so the two leaders refuse each
// other's writes and their terms end as "rejected" (a newer leader), and
// trim keeps every entry that a group, running or not, has not
// acknowledged (TestTwoGroupsOfOneStream). Each term looks, since a group
// may come later; a look that fails (XINFO refused, Redis failing) is
// skipped: the term goes on, and what fails there says why.
func (c *Consumer) noticeGroups(ctx context.Context) {
	if c.toldGroups.Load() {
		return
	}
	groups, err := bound.Call(ctx, func() ([]redis.XInfoGroup, error) {
		return c.Redis.XInfoGroups(ctx, c.Stream).Result()
	}, nil)
	if err != nil {
		return
	}
	var others []string
	for _, g := range groups {
		if g.Name != c.Group {
			others = append(others, g.Name)
		}
	}
	if len(others) > 0 && !c.toldGroups.Swap(true) {
		slices.Sort(others)
		c.log().Error(LogOtherGroups, "consumer", c.Name, "group", c.Group, "others", others)
	}
}
