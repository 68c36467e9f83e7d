"""One rank of an FSDP2 / tensor-parallel step, recorded on a fake process group, and its per-rank selective
checkpointing plans."""
