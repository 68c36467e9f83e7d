"""Devices: what a device is (real, or a named target estimated by a roofline) and how memory and time are
measured on it (torch.accelerator, torch-xla, AWS Neuron)."""
