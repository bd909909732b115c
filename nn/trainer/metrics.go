package trainer

import (
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
)

// Metrics writes one CSV row per epoch: MetricsHeader's columns.
type Metrics struct {
	f *os.File
	w *csv.Writer
}

// MetricsHeader is the first line of a metrics file (a program can tell
// by it that a file is one it may replace).
var MetricsHeader = []string{"epoch", "train_loss", "test_loss", "test_accuracy", "seconds", "images_per_second"}

// OpenMetrics creates the file at path, or appends to it when resuming (a
// resumed run continues the rows of the run it continues). The header is
// written into an empty file.
func OpenMetrics(path string, resuming bool) (*Metrics, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if resuming {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, err
	}
	m := &Metrics{f: f, w: csv.NewWriter(f)}
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		m.w.Write(MetricsHeader)
	}
	return m, nil
}

// write adds a row; a nil Metrics writes nothing.
func (m *Metrics) write(epoch int, trainLoss, testLoss, acc, secs, imgs float64) error {
	if m == nil {
		return nil
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	m.w.Write([]string{strconv.Itoa(epoch), f(trainLoss), f(testLoss), f(acc), f(secs), f(imgs)})
	m.w.Flush()
	if err := m.w.Error(); err != nil {
		return fmt.Errorf("metrics %s: %w", m.f.Name(), err)
	}
	return nil
}

// Close closes the file; a nil Metrics is left alone.
func (m *Metrics) Close() error {
	if m == nil {
		return nil
	}
	return m.f.Close()
}
