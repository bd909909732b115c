package trainer

import (
	"fmt"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows the running loss and speed of an epoch: a live bar when
// stderr is a terminal, plain lines otherwise (CI logs, pipes), since
// carriage-return frames make unreadable logs.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	label string
	total int
}

func newProgress(w io.Writer, total int, label string) *progress {
	p := &progress{w: w, label: label, total: total}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(label),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionThrottle(0),
		)
	}
	return p
}

func (p *progress) update(step int, loss float32, imgsPerSec float64) {
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s loss %.4f %.0f img/s", p.label, loss, imgsPerSec))
		p.bar.Set(step)
		return
	}
	fmt.Fprintf(p.w, "%s step %d/%d loss %.4f %.0f images/s\n", p.label, step, p.total, loss, imgsPerSec)
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}
