// Package parallel trains one model on several GPUs, of one machine or of
// many, with the semantics of PyTorch's DistributedDataParallel: one
// process per GPU, every process holding a full replica, each taking its
// share of every batch, gradients averaged so that all replicas take the
// same step.
//
// # Design
//
// The pieces, in the order a training program uses them:
//
//   - Environment (env.go): where this process stands, read from the
//     variables the launcher sets: torchrun's RANK, WORLD_SIZE,
//     LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, or Slurm's
//     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID. Nothing set: one process.
//   - Rendezvous (rendezvous.go): rank 0 listens on MASTER_ADDR and every
//     other rank connects, retrying until a deadline; rank 0 hands them the
//     NCCL unique id with the world size and the run's token. A rank that
//     never comes, or one with another world size or from another run,
//     ends the rendezvous on every rank with one line naming it.
//   - Communicator (comm.go): all-reduce (sum, average), broadcast,
//     barrier, abort. NCCL (nccl.go, over cuda.NCCLComm) queues the
//     collectives on the backend's stream, after the backward pass's
//     kernels and inside a captured step; TCP (tcp.go) joins processes
//     without NCCL (the CPU backend, CI) through rank 0, which sums in
//     rank order; FakeGroup (fake.go) runs N ranks as goroutines of one
//     test, summing in rank order so that results do not depend on timing.
//     Connect (connect.go) picks NCCL or TCP.
//   - DataParallel (dataparallel.go): parameters broadcast from rank 0,
//     gradients averaged in buckets of about 25 MiB. The optimiser packs
//     the gradients into one buffer (optim.NewSGD, tensor.Pack); a bucket
//     is a window of it, so nothing is copied. With Overlap (overlap.go)
//     each bucket's all-reduce starts from the backward pass as soon as
//     its gradients are final (tensor.SetGradReadyHook), with NCCL on a
//     second stream joined before the optimiser step, as DDP overlaps
//     communication with computation.
//   - Sharder (sharder.go): each rank's indices of one seeded permutation
//     of the data set, as torch's DistributedSampler: padded to a multiple
//     of the world size, rank r taking positions r, r+W, ...
//   - Checkpoints (checkpoint.go): written by rank 0 only; the others wait
//     for it and fail with it. A checkpoint holds no world size, so a
//     resume works at another one.
//   - Launch (launch.go): starts and supervises the processes of one
//     machine, as torchrun does.
//   - Watchdog (watchdog.go): polls the communicator's asynchronous error
//     and the current step's age; on a fault it aborts the communicator,
//     which unblocks this rank, and reports one line naming the rank.
//
// Why N ranks with batch B/N train as one rank with batch B: the loss is
// a mean over the batch, so the gradient of the mean over B samples is the
// average over the ranks of the gradients of the means over their B/N,
// which is what AllReduceGradients leaves on every rank. The Sharder makes
// the ranks' batches of one step together the batch of B that one process
// would take. TestDataParallelMatchesOneRank checks this with 2 and 4 fake
// ranks.
//
// # A training step
//
//	env, err := parallel.EnvironmentFromOS()
//	b, err := cuda.NewBackend(env.LocalRank, cuda.BackendOptions{})
//	comm, err := parallel.NewNCCL(ctx, env, b, parallel.RendezvousOptions{})
//	defer comm.Close()
//	opt, err := optim.NewSGD(nn.Parameters(model), cfg) // packs the gradients
//	dp, err := parallel.NewDataParallel(comm, nn.Parameters(model), parallel.DataParallelOptions{})
//	err = dp.BroadcastParameters()
//	sh, err := parallel.NewSharder(n, env.Rank, env.WorldSize, seed)
//	w := parallel.StartWatchdog(comm, parallel.WatchdogOptions{StepTimeout: 5 * time.Minute})
//	for each step: w.BeginStep(i); forward on this rank's B/N; loss.Backward();
//	               dp.AllReduceGradients(); opt.StepAndZeroGrad(); w.EndStep()
//	parallel.SaveCheckpoint(comm, path, model, state) // rank 0 writes
//
// # Launching
//
// One process per GPU. With torchrun, on each machine (--no-python runs the
// binary itself):
//
//	torchrun --no-python --nproc-per-node 8 --nnodes 2 --node-rank 0 \
//	    --master-addr node0 --master-port 29500 ./train --batch-size 512
//
// torchrun serves its own store on MASTER_PORT, so this package's
// rendezvous listens on MASTER_PORT+1 under torchrun (EMBER_RENDEZVOUS_PORT
// overrides). With Slurm, one task per GPU:
//
//	export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
//	export MASTER_PORT=29500
//	srun --ntasks-per-node 8 --gpus-per-task 1 ./train --batch-size 512
//
// With --gpus-per-task each task sees its GPU as device 0 (open ordinal 0
// then, not LOCAL_RANK; train takes LOCAL_RANK modulo the visible GPUs).
// Or train --nproc-per-node N starts the N local processes itself over
// Launch (launch.go): it sets the same variables, supervises the
// processes, ends them all with one line naming the rank when one fails,
// and forwards an interrupt to all. Across machines it is the same code
// with other addresses (NNodes, NodeRank, MasterAddr, MasterPort):
//
//	train --nproc-per-node 8 --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 ...
//
// nn/trainer's Config.Parallel runs the whole training loop this way
// (broadcast, sharding, overlapped buckets, SyncBatchNorm, rank-0
// checkpoints and logs, agreed interrupts, the watchdog).
//
// # Faults
//
// Every error of a collective is final for the job: a rank that died or
// hangs makes the others' collectives fail (NCCL's asynchronous error, or
// the watchdog's step deadline and abort), each rank prints its one line
// and exits, and the job resumes from the last checkpoint, which rank 0
// wrote atomically (nn.SaveCheckpoint) and the others waited for.
//
// Batch norm: each rank's own statistics by default (DDP's), or those of
// the whole global batch with nn.SetSyncBatchNorm (torch's SyncBatchNorm;
// train --sync-bn).
package parallel
