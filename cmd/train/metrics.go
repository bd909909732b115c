package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
)

// metricsFile writes one CSV row per epoch when --metrics is set.
type metricsFile struct {
	f *os.File
	w *csv.Writer
}

var metricsHeader = []string{"epoch", "train_loss", "test_loss", "test_accuracy", "seconds", "images_per_second"}

// openMetrics creates the file, or appends to it when resuming.
func openMetrics(path string, resuming bool) (*metricsFile, error) {
	if path == "" {
		return &metricsFile{}, nil
	}
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if resuming {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	m := &metricsFile{f: f, w: csv.NewWriter(f)}
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		m.w.Write(metricsHeader)
	}
	return m, nil
}

func (m *metricsFile) write(epoch int, trainLoss, testLoss, acc, secs, imgs float64) error {
	if m.w == nil {
		return nil
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	m.w.Write([]string{strconv.Itoa(epoch), f(trainLoss), f(testLoss), f(acc), f(secs), f(imgs)})
	m.w.Flush()
	if err := m.w.Error(); err != nil {
		return fmt.Errorf("--metrics %s: %w", m.f.Name(), err)
	}
	return nil
}

func (m *metricsFile) close() {
	if m.f != nil {
		m.f.Close()
	}
}
