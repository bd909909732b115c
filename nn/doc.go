// Package nn holds the layers of a network and their checkpoints.
//
// A model is any type with Forward (Module); its parameters and buffers
// are found in its struct fields (tree.go) and named as a PyTorch
// state_dict names them. The layers here are initialised and named as
// torch.nn's, so that SaveFile writes a safetensors file that torch's
// load_state_dict accepts with strict=True, and LoadFile reads one written
// by PyTorch:
//
//   - Conv2d (rectangular kernels, strides, paddings and dilations per
//     axis, groups, no bias: NewConv2dWith), Linear (over [..., in], with
//     or without bias), Embedding;
//   - BatchNorm1d, BatchNorm2d (running statistics and
//     num_batches_tracked, counted on the device), LayerNorm, Dropout;
//   - MaxPool2d, AvgPool2d (padding, ceil mode), AdaptiveAvgPool2d,
//     AdaptiveMaxPool2d;
//   - ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU, Identity, Flatten;
//   - Sequential, Residual, MultiheadSelfAttention and TransformerBlock
//     (the GPT block, its keys ln1, qkv, proj, mlp.0, ...).
//
// SetTraining switches every BatchNorm and Dropout of a model between
// training and evaluation, as torch's model.train(on); SetRandomSource
// gives its dropout layers a generator (a tensor.DeviceGenerator for a
// step captured in a CUDA graph). Recompute (layers_recompute.go) runs a
// block through tensor.Recompute, keeping its input and output for the
// backward pass and computing its activations again there, as
// torch.utils.checkpoint; RecomputeBlocks wraps every block of a model
// (a TransformerBlock, a Recomputer, recomputes its two halves apart),
// and a Sequential's Segments runs its layers in recomputed groups
// (checkpoint_sequential).
//
// Fusion (fuse.go): a Sequential runs groups of consecutive layers as one
// fused operation (Conv2d→ReLU→MaxPool2d, Conv2d→ReLU, BatchNorm→ReLU or
// GELU, Linear→ReLU, activations in a row as one generated kernel), a
// Residual adds its skip connection in its block's last activations, and a
// Sequential's CrossEntropyLoss runs its last Linear layer with the loss;
// the results are the layers' own up to the order of sums. SetFusion(m,
// false), or EMBER_FUSION=off, runs every layer on its own.
//
// Where to start: module.go (Module, Parameter), tree.go (how fields
// become state_dict names), one file per layer (conv2d.go, linear.go,
// layers.go, layers_*.go), then safetensors.go (the file format, validated
// before anything is loaded) and state.go (the training state saved beside
// a model for resuming). Package nntest runs the layers on another backend
// against the CPU.
package nn
