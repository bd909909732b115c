// random.cu: Philox4x32-10 counter-based random numbers, mirroring
// tensor/cpu_random.go bit for bit.
