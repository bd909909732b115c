// Package models holds ready-made networks: LeNet, the MNIST network of the
// benchmark, with its checkpoints (SaveCheckpoint, LoadCheckpoint) and
// inference (LoadLeNet, Predict, Evaluate).
package models
