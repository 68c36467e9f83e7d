"""Model -> CD-graph: capture (torch.export + the AOT joint graph), per-op costs, the memory eager PyTorch
holds (saved tensors, live storages)."""
