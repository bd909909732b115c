package trainer

import (
	"fmt"

	"github.com/ember-ml/ember/cuda"
)

// Monitor is told where a run stands, to report the device memory: the
// trainer calls Start before the first step, TrainingDone once an epoch's
// steps have finished on the device, EvaluationDone after the evaluation,
// and appends MemoryLine to the epoch's line. DriverAllocs counts the
// allocations the device driver made so far (a steady training step makes
// none). GPUMemory is the CUDA backend's.
type Monitor interface {
	Start()
	TrainingDone()
	EvaluationDone()
	MemoryLine() string
	DriverAllocs() int64
}

// GPUMemory reports the memory of a CUDA backend: the peaks reserved and
// allocated while training, without the data set and cuBLAS's workspace,
// which stay on the device for the whole run and are named apart.
type GPUMemory struct {
	b *cuda.Backend

	trainingPeakReserved  int
	trainingPeakAllocated int
	datasetAllocated      int // data set + cuBLAS workspace
	dataset               int
	freeAtStart           int // device free memory when NewGPUMemory ran
}

// NewGPUMemory starts a report of b's memory.
func NewGPUMemory(b *cuda.Backend) *GPUMemory {
	m := &GPUMemory{b: b}
	m.freeAtStart, _, _ = b.Device().MemGetInfo()
	return m
}

// MarkDataset records the bytes of the data set just uploaded: the
// training figures leave them, and cuBLAS's workspace, out.
func (m *GPUMemory) MarkDataset(bytes int) {
	m.datasetAllocated = bytes + m.b.BLASWorkspace()
	m.dataset = bytes
}

// Start resets the allocator's peaks.
func (m *GPUMemory) Start() { m.b.Allocator().ResetPeakStats() }

// TrainingDone records the peaks of the steps so far.
func (m *GPUMemory) TrainingDone() {
	s := m.b.MemoryStats()
	m.trainingPeakReserved = max(m.trainingPeakReserved, s.Reserved.Peak)
	m.trainingPeakAllocated = max(m.trainingPeakAllocated, s.Allocated.Peak)
}

// EvaluationDone hands the evaluation's cached blocks back, so that the
// training step runs in only its own memory, and resets the peaks.
func (m *GPUMemory) EvaluationDone() {
	m.b.Allocator().EmptyCache()
	m.b.Allocator().ResetPeakStats()
}

// DriverAllocs counts the driver allocations so far.
func (m *GPUMemory) DriverAllocs() int64 { return int64(m.b.MemoryStats().DriverAllocs) }

// MemoryLine is the memory part of an epoch's line.
func (m *GPUMemory) MemoryLine() string {
	s := m.b.MemoryStats()
	return fmt.Sprintf(", GPU memory: training peak reserved %s, allocated %s (plus %s data set, %s cuBLAS workspace); reserved now %s",
		MiB(m.trainingPeakReserved-m.datasetAllocated), MiB(m.trainingPeakAllocated-m.datasetAllocated),
		MiB(m.dataset), MiB(m.b.BLASWorkspace()), MiB(s.Reserved.Current))
}

// BenchRows writes the memory rows of a benchmark table (markdown) through
// logf, for a run of steps training steps that made stepAllocs driver
// allocations after the first.
func (m *GPUMemory) BenchRows(logf func(string, ...any), steps int, stepAllocs int64) {
	s := m.b.MemoryStats()
	logf("| GPU memory reserved, training peak, without data set and cuBLAS workspace | %s |", MiB(m.trainingPeakReserved-m.datasetAllocated))
	logf("| GPU memory allocated, training peak, without data set and cuBLAS workspace | %s |", MiB(m.trainingPeakAllocated-m.datasetAllocated))
	logf("| uint8 data set on the GPU (train + test) | %s |", MiB(m.dataset))
	logf("| cuBLAS workspace (from the allocator) | %s |", MiB(m.b.BLASWorkspace()))
	logf("| GPU memory reserved at the end (with evaluation) | %s |", MiB(s.Reserved.Current))
	if free, _, err := m.b.Device().MemGetInfo(); err == nil && m.freeAtStart > 0 {
		// What the device lost since the report started: our reserved
		// memory plus what libraries (cuBLAS's workspace) took themselves.
		logf("| device memory taken since the backend opened, with its cuBLAS workspace (cuMemGetInfo) | %s |", MiB(m.freeAtStart-free+m.b.BLASWorkspace()))
	}
	if steps > 1 {
		logf("| driver allocations by training steps after the first | %d (%.4f per step) |",
			stepAllocs, float64(stepAllocs)/float64(steps-1))
	}
}

// MiB formats a byte count in mebibytes, one decimal.
func MiB(b int) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
