// Package models holds ready-made networks built from package nn's
// layers:
//
//   - LeNet, the MNIST network of the benchmark, with its checkpoints
//     (SaveCheckpoint, LoadCheckpoint) and inference (LoadLeNet, Predict,
//     Evaluate), and an MLP;
//   - the model zoo of the PyTorch comparisons (docs/bench/torch_interop.py
//     and zoo.py's networks): ResNet9 (DAWNBench's ResNet-9, for
//     Fashion-MNIST or CIFAR), Airbench (airbench94's CIFAR-10 network) and
//     GPT (a nanoGPT-sized character transformer).
//
// Every network's state dict has the keys and shapes of its PyTorch
// module, so that a checkpoint saved by one loads into the other with
// strict=True (nn.SaveFile, nn.LoadFile). Start with NewResNet9 and its
// example; zoo_gpu_test.go runs the zoo's benchmarks on a GPU.
//
// The registry (registry.go) knows each model by name: New builds one from
// a Config (input shape, classes, seed), Metadata names the architecture
// in a checkpoint, and LoadModel rebuilds whatever model a checkpoint
// holds. Adding a model is one entry in the registry's table.
package models
