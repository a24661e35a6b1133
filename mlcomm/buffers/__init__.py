"""The buffers a collective runs on: host and device arrays, GPUs, staging, tensors."""
