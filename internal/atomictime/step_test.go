package atomictime

import (
	"testing"
	"time"
	"unsafe"
)

// timeLayout is time.Time's layout (wall, ext, loc), to make a time whose
// wall and monotonic readings disagree as they do across a step of the
// wall clock (NTP, an operator) or a suspended VM (the monotonic clock
// stands still, the wall clock does not).
type timeLayout struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

// A time stored after the wall clock was stepped (here: base's wall
// reading an hour behind the monotonic one's, as if the wall clock was set
// an hour forward since base was read) loads with the wall reading it was
// stored with: Deadline is logged (slog.Time("deadline", ...)), printed in
// fence.Run's error and may be sent to others by its wall reading. Load
// made it base's wall reading plus the monotonic difference: an hour off.
func TestLoadKeepsWallReadingAcrossClockStep(t *testing.T) {
	a := time.Now()
	skewed := a.Add(time.Hour)
	(*timeLayout)(unsafe.Pointer(&skewed)).wall = (*timeLayout)(unsafe.Pointer(&a)).wall
	if !skewed.Round(0).Equal(a.Round(0)) || skewed.Sub(a) != time.Hour {
		t.Fatalf("could not make a stepped time (time.Time's layout changed?): %v vs %v", skewed, a)
	}
	saved := base
	base = skewed
	defer func() { base = saved }()

	var at Time
	v := time.Now().Add(time.Minute)
	at.Store(v)
	got := at.Load()
	if got.Sub(v) != 0 {
		t.Fatalf("Load = %v, %v off %v by the monotonic clock", got, got.Sub(v), v)
	}
	if off := got.Round(0).Sub(v.Round(0)); off < -time.Millisecond || off > time.Millisecond {
		t.Fatalf("Load's wall reading is %v off the stored one (%v, stored %v)", off, got.Round(0), v.Round(0))
	}
}
