package queue

import (
	"context"
	"slices"

	"github.com/fencekit/fence/internal/bound"
	"github.com/redis/go-redis/v9"
)

// groupsKey is the set of the stream's groups that run this consumer
// (see noticeGroups): in the stream's hash slot.
func (c *Consumer) groupsKey() string { return "{" + c.Stream + "}:groups" }

// noticeGroups logs at ERROR (LogOtherGroups), once per Consumer, that
// other groups of the stream run this consumer too. This package's tables
// are keyed by stream and message id, not by group: a second group of
// consumers (a second -group by mistake, or a group renamed while the old
// one still runs) does not apply a message twice, but its leader fences
// the same guard resources with another lock's tokens, so the two leaders
// refuse each other's writes and their terms end as "rejected" (a newer
// leader) (TestTwoGroupsOfOneStream). Another application's group on the
// stream (fan-out, what groups are for: an audit log) fences nothing, and
// is not told (TestOtherApplicationsGroupNotAnError): each Consumer adds
// its group to a set beside the stream (groupsKey) as a term begins, and
// the groups told are those in that set that XINFO GROUPS still lists (a
// group destroyed is not). Each term looks, so a consumer whose writes
// another group refused tells it at its next term; a look that fails (the
// set or XINFO refused, Redis failing) is skipped: the term goes on, and
// what fails there says why. Consumers of versions before the set are
// not in it, and are not told.
func (c *Consumer) noticeGroups(ctx context.Context) {
	if c.toldGroups.Load() {
		return
	}
	type seen struct {
		ours   []string
		listed []redis.XInfoGroup
	}
	s, err := bound.Call(ctx, func() (seen, error) {
		var members *redis.StringSliceCmd
		var groups *redis.XInfoGroupsCmd
		_, err := c.Redis.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.SAdd(ctx, c.groupsKey(), c.Group)
			members = p.SMembers(ctx, c.groupsKey())
			groups = p.XInfoGroups(ctx, c.Stream)
			return nil
		})
		if err != nil {
			return seen{}, err
		}
		return seen{members.Val(), groups.Val()}, nil
	}, nil)
	if err != nil {
		return
	}
	var others []string
	for _, g := range s.listed {
		if g.Name != c.Group && slices.Contains(s.ours, g.Name) {
			others = append(others, g.Name)
		}
	}
	if len(others) > 0 && !c.toldGroups.Swap(true) {
		slices.Sort(others)
		c.log().Error(LogOtherGroups, "consumer", c.Name, "group", c.Group, "others", others)
	}
}
