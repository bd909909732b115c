// Package faults holds no code: its test builds the train and predict
// commands and runs the built binaries against a table of bad inputs and
// faults (truncated and malformed files, special files such as /dev/zero,
// /dev/full, FIFOs and directories, unwritable paths, bad flags, broken
// checkpoints), checking for each the exit status, a single error line
// naming the file or flag, no stack trace, files left byte-identical, no
// hang, and bounded memory; and a data-parallel job of the built train
// (--nproc-per-node 2 on the CPU) interrupted, and with a rank killed. It
// is the evidence for the exit statuses the README promises.
package faults
