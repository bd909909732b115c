// index.cu: gathers and scatter-adds along an axis (IndexSelect,
// IndexAdd, embeddings), mirroring tensor/cpu_index.go.
