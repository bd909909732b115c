package optim

import "math"

// StepLR multiplies the learning rate by Gamma every StepSize epochs, as
// torch.optim.lr_scheduler.StepLR does.
type StepLR struct {
	BaseLR   float64
	StepSize int
	Gamma    float64
}

// LR is the learning rate for a 0-based epoch.
func (s StepLR) LR(epoch int) float64 {
	if s.StepSize <= 0 {
		return s.BaseLR
	}
	return s.BaseLR * math.Pow(s.Gamma, float64(epoch/s.StepSize))
}
