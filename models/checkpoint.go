package models

import "github.com/ember-ml/ember/nn"

// The training checkpoint API is generic (any nn.Module, the optimiser
// state as a flat momentum slice), so it lives in package nn, where the
// file layout and the crash-consistency design are documented (nn/state.go);
// these names forward to it for the commands that work with models.

// TrainingState is what a training run needs, besides the weights, to
// continue where it stopped; see nn.TrainingState.
type TrainingState = nn.TrainingState

// SaveCheckpoint writes the model file modelPath (a PyTorch-loadable state
// dict) and the training state beside it (StatePath), atomically and
// crash-consistently; see nn.SaveCheckpoint.
func SaveCheckpoint(modelPath string, m nn.Module, st *TrainingState) error {
	return nn.SaveCheckpoint(modelPath, m, st)
}

// LoadCheckpoint checks that the model file and the training state beside
// it belong together and fit m, then loads m's parameters and returns the
// state; see nn.LoadCheckpoint.
func LoadCheckpoint(modelPath string, m nn.Module) (*TrainingState, error) {
	return nn.LoadCheckpoint(modelPath, m)
}

// StatePath is the training state file beside a model file:
// X.safetensors → X.state.safetensors.
func StatePath(modelPath string) string { return nn.StatePath(modelPath) }

// RemoveCheckpointTemps removes temporary files that saves of modelPath
// interrupted by a crash left behind. Call it only when no other process
// may be saving to the same path (when a training run starts).
func RemoveCheckpointTemps(modelPath string) ([]string, error) {
	return nn.RemoveCheckpointTemps(modelPath)
}
