// Package models holds ready-made networks: LeNet, the MNIST network of the
// benchmark, and an MLP, with their checkpoints (SaveCheckpoint,
// LoadCheckpoint) and inference (LoadLeNet, Predict, Evaluate).
//
// The registry (registry.go) knows each model by name: New builds one from
// a Config (input shape, classes, seed), Metadata names the architecture
// in a checkpoint, and LoadModel rebuilds whatever model a checkpoint
// holds. Adding a model is one entry in the registry's table.
package models
