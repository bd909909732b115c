package cuda

import (
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TestCuDNNForwardPadded: a channels-last forward pass on 24 input
// channels is timed on its first call both as it is and padded to 32
// channels, and each later call takes the faster way; inside a capture an
// undecided geometry runs as it is and stays undecided.
func TestCuDNNForwardPadded(t *testing.T) {
	g := tensor.ConvGeom{N: 2, C: 24, H: 31, W: 31, K: 64, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1}
	c := convShapeOf("test", g)
	for _, padFaster := range []bool{true, false} {
		b, rec, f := fakeBackend(t, false)
		timed := 0
		b.dnn.clock = func(warm, run func() error) (time.Duration, error) {
			if err := warm(); err != nil {
				return 0, err
			}
			if err := run(); err != nil {
				return 0, err
			}
			timed++
			if timed == 2 && padFaster { // the unpadded way is timed first
				return time.Millisecond, nil
			}
			return 2 * time.Millisecond, nil
		}
		bf := func(n int) tensor.Buffer {
			buf, err := b.Alloc(n, tensor.BFloat16)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Free(buf) })
			return buf
		}
		x, y, w := bf(c.xLen), bf(c.yLen), recBuf(t, b, c.wLen)
		plans := func() (plain, padded *convPlan) {
			for geom, p := range b.dnn.plans {
				switch geom.c {
				case 24:
					plain = p
				case 32:
					padded = p
				}
			}
			return plain, padded
		}

		b.capturing.Store(true)
		b.Conv2dChannelsLast(y, x, w, tensor.Buffer{}, g)
		b.capturing.Store(false)
		plain, _ := plans()
		if plain == nil || plain.padForward != padUndecided || rec.launches["ember_cl_pad_channels"] != 0 || timed != 0 {
			t.Fatalf("inside a capture: plan %v, %d pad launches, %d timings; want an undecided plan, none and none", plain, rec.launches["ember_cl_pad_channels"], timed)
		}
		plain.found[dirForward] = false // searched as outside a capture

		b.Conv2dChannelsLast(y, x, w, tensor.Buffer{}, g)
		plain, padded := plans()
		if timed != 2 || padded == nil {
			t.Fatalf("first call: %d timings and padded plan %v; want 2 and a plan of 32 channels", timed, padded)
		}
		want := padNo
		if padFaster {
			want = padYes
		}
		if plain.padForward != want {
			t.Errorf("padded faster %v: the plan says %d, want %d", padFaster, plain.padForward, want)
		}
		pads := rec.launches["ember_cl_pad_channels"]
		b.Conv2dChannelsLast(y, x, w, tensor.Buffer{}, g)
		gotPads := rec.launches["ember_cl_pad_channels"] - pads
		wantX := plain.descs.x
		if padFaster {
			wantX = padded.descs.x
			if gotPads != 2 {
				t.Errorf("a padded call launched %d pads, want 2 (x and the filter)", gotPads)
			}
		} else if gotPads != 0 {
			t.Errorf("an unpadded call launched %d pads", gotPads)
		}
		if got := f.last("fwd").args[2]; got != wantX {
			t.Errorf("padded faster %v: the forward pass read x through descriptor %#x, want %#x", padFaster, got, wantX)
		}
		if timed != 2 {
			t.Errorf("a second call timed again (%d timings)", timed)
		}
	}
}

func TestPadChannelsTo(t *testing.T) {
	for c, want := range map[int]int{24: 32, 32: 32, 8: 32, 40: 64, 64: 64, 3: 3, 12: 12, 96: 96, 104: 128} {
		if got := padChannelsTo(c); got != want {
			t.Errorf("padChannelsTo(%d) = %d, want %d", c, got, want)
		}
	}
}
