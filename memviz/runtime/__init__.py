"""A plan run on torch: `memviz.export` (the schedule as generated code, torch.compile), `memviz.apply`
(PyTorch's own checkpointing), one measured step (`verify`)."""
