package redislock

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestInt64s: int64s reads what Int64Slice reads, into the caller's buffer,
// and fails where it fails.
func TestInt64s(t *testing.T) {
	cmd := func(v any, err error) *redis.Cmd {
		c := redis.NewCmd(context.Background())
		c.SetVal(v)
		c.SetErr(err)
		return c
	}
	boom := errors.New("boom")
	for _, tc := range []struct {
		name    string
		reply   *redis.Cmd
		want    []int64
		wantErr bool
	}{
		{"ints", cmd([]any{int64(1), int64(42), int64(1700000000000)}, nil), []int64{1, 42, 1700000000000}, false},
		{"empty", cmd([]any{}, nil), []int64{}, false},
		{"numeric strings", cmd([]any{int64(0), "7"}, nil), []int64{0, 7}, false},
		{"not a number", cmd([]any{int64(0), "x"}, nil), nil, true},
		{"not an array", cmd(int64(1), nil), nil, true},
		{"error", cmd(nil, boom), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf [3]int64
			got, err := int64s(tc.reply, buf[:0])
			want, wantErr := tc.reply.Int64Slice()
			if (err != nil) != tc.wantErr || (wantErr != nil) != tc.wantErr {
				t.Fatalf("int64s = %v, %v; Int64Slice = %v, %v; want error %v", got, err, want, wantErr, tc.wantErr)
			}
			if !tc.wantErr && (!slices.Equal(got, tc.want) || !slices.Equal(got, want)) {
				t.Fatalf("int64s = %v, Int64Slice = %v, want %v", got, want, tc.want)
			}
		})
	}
}
